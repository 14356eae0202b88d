"""HybridCache: memory -> SSD -> Redis behind one get/put, degrading instead of failing.

- Lookup goes down the tiers; a hit below the top is promoted (copied) into every tier above.
- Writes go to the tiers in `write_through`; the others receive values when they are evicted from
  the tier above (write-back / demotion), so a cold value leaves memory for SSD, not for nowhere.
- Any exception from a tier is counted and treated as a miss or a refused write: a broken SSD or
  an unreachable Redis makes the cache smaller, never the request fail.
- Answers (exact responses, semantic buckets) are valid only under the generations they were
  computed in (`generations.py`): each copy carries its stamp, a lookup reads the current one
  (with the Redis value, in one round trip, when memory and SSD miss) and serves the first copy
  that matches; a copy that does not is dropped lazily. `invalidate` increments a counter and
  no process serves the old answer after it returns, whatever copies are left or in flight.
  Copies between tiers (promotions, demotions) are therefore unchecked.
- Without readable generations (Redis down) answers miss, and say so in `check()` and the
  metrics; KV pages and embeddings are immutable (keyed by their tokens or text and the
  model) and keep hitting from every tier that still works.
- A promoted value keeps the expiry it had in the tier it came from.
- TTL per entry: fixed (expires `ttl_s` after the write) or renew-on-hit (each hit resets it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from cache_runtime.generations import (
    ANSWER_KINDS,
    AnswerScope,
    Generations,
    LocalGenerations,
    Stamp,
    stamped,
    template_counter,
    tenant_counter,
    unstamped,
)
from cache_runtime.keys import CacheKey, EmbeddingKey, ExactKey, PrefixKey, SemanticKey
from cache_runtime.metrics import CacheMetrics
from cache_runtime.sessions import TenantSessionPages
from cache_runtime.tiers.base import Tier

TtlMode = Literal["fixed", "renew"]
_UNKNOWN = object()  # what a tier call that raised returns where None means something
_KINDS = frozenset(k.kind for k in (ExactKey, EmbeddingKey, SemanticKey, PrefixKey))
_RECENT_ERROR_S = 10.0  # a tier that failed a call this recently is reported degraded


@dataclass(frozen=True, slots=True)
class Lookup:
    """A lookup's value (None on a miss), the tier that answered, and, for an answer key, the
    generations read: what a value computed from now on is stored with (`put(generations=)`);
    None for immutable kinds, and for answers when the generations could not be read."""

    value: bytes | None
    tier: str | None
    generations: Stamp | None


def key_kind(key: str) -> str:
    """The kind field of a cache key string ("other" for anything else), read off the string:
    this runs on every lookup, where parsing the whole key cost more than a Redis GET's tenth."""
    parts = key.split("|", 3)
    return parts[2] if len(parts) == 4 and parts[0] == "ph" and parts[2] in _KINDS else "other"


def _string(key: CacheKey | str | None) -> str | None:
    return key if key is None or isinstance(key, str) else key.to_string()


def _copyable(ttl: Any) -> bool:
    """Whether a value with `ttl` seconds left may be copied up: an unknown expiry must not
    become "never", and an expired value is not copied."""
    return ttl is not _UNKNOWN and (ttl is None or ttl > 0)


class HybridCache:
    """Tiers from fastest to slowest; `write_through` names the tiers every put writes to
    (default: all). The others are filled by demotion and promotion only."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        write_through: Sequence[str] | None = None,
        metrics: CacheMetrics | None = None,
        refill_workers: int = 2,
        generations: Generations | None = None,
        sessions: TenantSessionPages | None = None,
    ) -> None:
        """`generations`: where answers' counters live; by default the Redis tier's
        (`RedisTier.generations()`, shared with every process using that Redis), else this
        process's own (`LocalGenerations`: no other process can invalidate). `sessions`: what
        each conversation read (`end_session`); a default `TenantSessionPages()` when None."""
        if not tiers:
            raise ValueError("a hybrid cache needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique: {names}")
        self.tiers = list(tiers)
        self.write_through = set(names if write_through is None else write_through)
        unknown = self.write_through - set(names)
        if unknown:
            raise ValueError(f"write_through names unknown tiers: {sorted(unknown)}")
        self.metrics = metrics or CacheMetrics()
        self.sessions = sessions if sessions is not None else TenantSessionPages()
        shared = [t for t in self.tiers if callable(getattr(t, "generations", None))]
        if generations is None:
            generations = shared[0].generations() if shared else LocalGenerations()  # type: ignore[attr-defined]
        self.generations = generations
        # the last tier, when it reads in the generations' round trip (`_read`)
        last = self.tiers[-1]
        pipelines = getattr(last, "pipelines_with", None)
        self._pipelined = last if callable(pipelines) and pipelines(generations) else None
        self._renew: dict[str, float] = {}  # keys with renew-on-hit TTL -> their TTL
        self._last_errors: dict[str, tuple[float, str]] = {}  # tier -> (monotonic, what failed)
        self._renew_lock = threading.Lock()
        self._refills = ThreadPoolExecutor(refill_workers, thread_name_prefix="preheat-refill")
        for upper, lower in zip(self.tiers, self.tiers[1:], strict=False):
            if hasattr(upper, "on_evict"):
                upper.on_evict = self._demoter(lower)

    # -- core ----------------------------------------------------------------------------------

    def get(
        self,
        key: CacheKey | str,
        parent: CacheKey | str | None = None,
        *,
        template: str | None = None,
    ) -> bytes | None:
        """The value from the fastest tier holding a valid copy, promoted into the tiers above;
        or None. `template`: an answer's template (its generation scope, see `lookup`).

        `parent`: for a KV page, the page before it (its prefix). A promoted page is then
        linked to its parent in the tiers above, so the memory tier keeps the chain
        prefix-closed. A prefix key holds a hash of its parent's, not the parent's key, so the
        caller, which walks the chain in order, is the one that knows it."""
        return self.lookup(key, parent, template=template).value

    def get_with_tier(
        self, key: CacheKey | str, parent: CacheKey | str | None = None
    ) -> tuple[bytes | None, str | None]:
        """`get`, also naming the tier that answered (None on a miss): what a load cost."""
        found = self.lookup(key, parent)
        return found.value, found.tier

    def lookup(
        self,
        key: CacheKey | str,
        parent: CacheKey | str | None = None,
        *,
        template: str | None = None,
    ) -> Lookup:
        """`get` with the tier that answered and, for an answer, the generations it read: the
        caller that computes the answer after a miss stores it with `put(generations=...)`.
        An answer's `template` must be the one its puts give (None: untemplated)."""
        text = str(_string(key))
        kind = key_kind(text)
        scope = AnswerScope.of(text, template) if kind in ANSWER_KINDS else None
        stamp: Stamp | None = None
        for depth, tier in enumerate(self.tiers):
            if scope is not None and stamp is None and tier is self._pipelined:
                stamp, raw = self._read(scope, tier)  # counters and value: one round trip
                if stamp is None:
                    return Lookup(None, None, None)  # cannot be validated (`_read` counts)
            else:
                raw = self._call(tier, "get", tier.get, text)
                if scope is not None and stamp is None and raw is not None:
                    stamp, _ = self._read(scope)
                    if stamp is None:
                        return Lookup(None, None, None)
            value = raw if raw is None or stamp is None else unstamped(raw, stamp)
            if raw is not None and value is None:  # stored before an invalidation: dropped
                self.metrics.lookups.labels(tier.name, kind, "stale").inc()
                self._call(tier, "delete", tier.delete, text)
                continue
            self.metrics.lookups.labels(tier.name, kind, "miss" if raw is None else "hit").inc()
            if raw is not None and value is not None:
                self._after_hit(text, raw, depth, _string(parent))
                return Lookup(value, tier.name, stamp)
        if scope is not None and stamp is None:
            stamp, _ = self._read(scope)
        with self._renew_lock:  # gone from every tier: its renew-on-hit TTL goes too
            self._renew.pop(text, None)
        return Lookup(None, None, stamp)

    def _read(self, scope: AnswerScope, tier: Tier | None = None) -> tuple[Stamp | None, Any]:
        """The generations of `scope` (and the value `tier` holds, in the same round trip)."""
        also = tier.redis_key(scope.key) if tier is not None else None  # type: ignore[attr-defined]
        stamp, value = self.generations.read(scope, also)
        if stamp is None:
            kind = key_kind(scope.key)
            self.metrics.lookups.labels("generations", kind, "unvalidated").inc()
        return stamp, value

    def _after_hit(self, key: str, raw: bytes, depth: int, parent: str | None) -> None:
        """Renew a renew-on-hit TTL; promote a copy found below the top (unchecked: it carries
        its stamp, so a stale one can never be served from the tier it goes to)."""
        tier = self.tiers[depth]
        renew = self._renew_on_hit(key, depth)
        if not depth:
            return
        ttl = renew if renew is not None else self._call(
            tier, "ttl", tier.ttl_left, key, on_error=_UNKNOWN
        )  # fmt: skip
        if not _copyable(ttl):
            return
        for upper in self.tiers[:depth]:
            if self._call(upper, "put", upper.put, key, raw, ttl_s=ttl, parent=parent):
                self.metrics.promotions.labels(upper.name).inc()

    def _renew_on_hit(self, key: str, depth: int) -> float | None:
        """Renew `key`'s renew-on-hit TTL in the tier at `depth` that served it; the TTL, or
        None where it has none to renew."""
        renew = self._renewed_ttl(key)
        if renew is not None:
            tier = self.tiers[depth]
            self._call(tier, "touch", tier.touch, key, renew)
        return renew

    def get_chain(
        self, keys: Sequence[PrefixKey | str], parent: PrefixKey | str | None = None
    ) -> list[tuple[bytes, str]]:
        """(value, tier) of the longest run of leading `keys` cached: a KV prefix chain, in
        order, read with one call per tier (`get_many` where the tier has it, else key by key),
        each tier asked only for the pages the tiers above lacked. `parent`: the page before
        `keys[0]`, if any.

        Pages found below the top are promoted into the top tier only, in chain order, each
        with the expiry it had (one `ttl_left_many` call per tier that served some); the tiers
        between receive them by demotion when the top evicts them, as for any value written
        through. Promoting into every tier above, as `get` does, wrote each page restored from
        Redis to the SSD on the restore's path, and as a background task it still took the
        CPU from the restore: a 512-token restore on a just-restarted node took 300-560 ms
        instead of ~60 ms (`preheat bench kv`, GPT-2 small, 2 cores)."""
        texts = [str(_string(key)) for key in keys]
        found: list[tuple[bytes, int] | None] = [None] * len(texts)
        for depth, tier in enumerate(self.tiers):
            ask = [i for i, hit in enumerate(found) if hit is None]
            if not ask:
                break
            values = self._get_many(tier, [texts[i] for i in ask])
            hits = 0
            for i, value in zip(ask, values, strict=True):
                if value is not None:
                    found[i], hits = (value, depth), hits + 1
            self.metrics.lookups.labels(tier.name, "prefix", "hit").inc(hits)
            self.metrics.lookups.labels(tier.name, "prefix", "miss").inc(len(ask) - hits)
        run = next((i for i, hit in enumerate(found) if hit is None), len(found))
        chain = [hit for hit in found[:run] if hit is not None]
        self._promote_chain(texts[:run], chain, [_string(parent), *texts][:run])
        return [(value, self.tiers[depth].name) for value, depth in chain]

    def _get_many(self, tier: Tier, keys: list[str]) -> list[bytes | None]:
        many = getattr(tier, "get_many", None)
        if not callable(many):
            return [self._call(tier, "get", tier.get, key) for key in keys]
        values = self._call(tier, "get", many, keys)
        return [None] * len(keys) if values is None else values

    def _promote_chain(
        self, keys: list[str], chain: list[tuple[bytes, int]], parents: list[str | None]
    ) -> None:
        """Renew renew-on-hit TTLs; copy the pages found below the top into the top tier, in
        order, stopping at the first that cannot go (a later one would have no parent there)."""
        top, ttls = self.tiers[0], self._chain_ttls(keys, chain)
        for key, (value, depth), parent, ttl in zip(keys, chain, parents, ttls, strict=True):
            renew = self._renew_on_hit(key, depth)
            ttl = renew if renew is not None else ttl
            if not depth:
                continue
            if not _copyable(ttl):
                break
            if not self._call(top, "put", top.put, key, value, ttl_s=ttl, parent=parent):
                break
            self.metrics.promotions.labels(top.name).inc()

    def _chain_ttls(self, keys: list[str], chain: list[tuple[bytes, int]]) -> list[Any]:
        """Seconds left of each page found below the top (`_UNKNOWN` where its tier failed),
        with one call per tier where the tier has `ttl_left_many`; None for the top's own."""
        ttls: list[Any] = [None] * len(keys)
        for depth in sorted({depth for _, depth in chain} - {0}):
            tier, where = self.tiers[depth], [i for i, hit in enumerate(chain) if hit[1] == depth]
            many = getattr(tier, "ttl_left_many", None)
            if callable(many):
                found = self._call(tier, "ttl", many, [keys[i] for i in where])
                left = [_UNKNOWN] * len(where) if found is None else found
            else:
                left = [
                    self._call(tier, "ttl", tier.ttl_left, keys[i], on_error=_UNKNOWN)
                    for i in where
                ]
            for i, seconds in zip(where, left, strict=True):
                ttls[i] = seconds
        return ttls

    def put(
        self,
        key: CacheKey | str,
        value: bytes,
        *,
        ttl_s: float | None = None,
        ttl_mode: TtlMode = "fixed",
        pinned: bool = False,
        parent: CacheKey | str | None = None,
        hint: str | None = None,
        template: str | None = None,
        generations: Stamp | None = None,
    ) -> bool:
        """Write to the write-through tiers; True if at least one stored it. `hint`: see
        `policies.Hint` (for a KV page: `Hint.TAIL` when it is the prompt's last page).

        An answer is stored with its generations: `generations`, the stamp of the lookup it
        was computed after (`lookup(...).generations`), if they are still current, else it
        is not stored (False, counted "superseded"); None stamps it with the generations now,
        for a value that depends on nothing an invalidation could change meanwhile. Not a
        compare-and-set: an invalidation between the check and the write leaves a copy that
        can never be served (its stamp is old), dropped by the next lookup."""
        text = str(_string(key))
        kind = key_kind(text)
        if kind in ANSWER_KINDS:
            current, _ = self.generations.read(AnswerScope.of(text, template))
            if current is None or (generations is not None and generations != current):
                result = "unvalidated" if current is None else "superseded"
                self.metrics.writes.labels("all", kind, result).inc()
                return False
            value = stamped(current, value)
        with self._renew_lock:
            if ttl_mode == "renew" and ttl_s is not None:
                self._renew[text] = ttl_s
            else:
                self._renew.pop(text, None)
        stored = False
        for tier in self.tiers:
            if tier.name not in self.write_through:
                continue
            ok = self._call(
                tier, "put", tier.put, text, value,
                ttl_s=ttl_s, pinned=pinned, parent=_string(parent), hint=hint,
            )  # fmt: skip
            self.metrics.writes.labels(tier.name, kind, "stored" if ok else "refused").inc()
            stored = stored or bool(ok)
        return stored

    # -- invalidation --------------------------------------------------------------------------

    def invalidate(
        self,
        key: CacheKey | str,
        refill: Callable[[], bytes | None] | None = None,
        *,
        template: str | None = None,
        **put_options: Any,
    ) -> Future[bool] | None:
        """No process serves `key`'s current answer once this returns; if `refill` is given,
        it is recomputed under the new generation and stored in the background (the future
        says whether it was; an invalidation meanwhile supersedes it). For an immutable kind
        (KV page, embedding) this is a delete.

        Raises:
            GenerationsUnavailable: Redis could not take the increment: nothing was
                invalidated, and the caller must retry."""
        text = str(_string(key))
        self.delete(text)
        if refill is None:
            return None

        def run() -> bool:
            try:
                stamp = self.lookup(text, template=template).generations  # before computing
                value = refill()
            except Exception:
                self.metrics.refills.labels("failed").inc()
                return False
            if value is None:
                self.metrics.refills.labels("empty").inc()
                return False
            options = {"template": template, "generations": stamp, **put_options}
            stored = stamp is not None and self.put(text, value, **options)
            self.metrics.refills.labels("stored" if stored else "refused").inc()
            return stored

        return self._refills.submit(run)

    def delete(self, key: CacheKey | str) -> bool:
        """`invalidate` without a refill; whether a tier held a copy. The copies are deleted
        too, to free their space (an answer's would never be served again anyway)."""
        text = str(_string(key))
        if key_kind(text) in ANSWER_KINDS:
            self.generations.bump(("key", text))
        with self._renew_lock:
            self._renew.pop(text, None)
        return any([self._call(t, "delete", t.delete, text) for t in self.tiers])

    def invalidate_template(self, tenant: str, template: str | None) -> None:
        """Every answer of `tenant` stored with `template` (None: untemplated) misses from now
        on, in every process. Raises `GenerationsUnavailable` as `invalidate` does."""
        self.generations.bump(template_counter(tenant, template))

    def invalidate_tenant(self, tenant: str) -> None:
        """Every answer of `tenant` misses from now on; KV pages and embeddings stay."""
        self.generations.bump(tenant_counter(tenant))

    def is_current(self, key: str, stamp: Stamp, template: str | None = None) -> bool:
        """Whether the answer `key` computed under `stamp` is still valid: for an answer found
        another way (a semantic entry names the exact answer it came from)."""
        current, _ = self._read(AnswerScope.of(key, template))
        return current is not None and current == stamp

    # -- lookups by key kind -------------------------------------------------------------------

    def get_exact(self, tenant: str, model_id: str, prompt: str) -> bytes | None:
        return self.get(ExactKey.of(tenant, model_id, prompt))

    def get_semantic(self, key: SemanticKey, verify: Callable[[bytes], bool]) -> bytes | None:
        """A semantic hit only if `verify(value)` accepts it (the caller checks the stored
        prompt's similarity): an unverified near-match is never returned."""
        value = self.get(key)
        if value is None:
            return None
        if verify(value):
            return value
        self.metrics.lookups.labels("verify", "semantic", "rejected").inc()
        return None

    def longest_prefix(self, pages: Sequence[PrefixKey]) -> int:
        """How many leading pages of a chain are cached (a page is usable only after all before
        it): one call per tier (`contains_many` where the tier has it), each tier asked only
        about the pages the tiers above lack."""
        texts = [page.to_string() for page in pages]
        held = [False] * len(texts)
        for tier in self.tiers:
            ask = [i for i, known in enumerate(held) if not known]
            if not ask:
                break
            many = getattr(tier, "contains_many", None)
            if callable(many):
                answers = self._call(tier, "contains", many, [texts[i] for i in ask]) or []
            else:
                answers = [self._call(tier, "contains", tier.contains, texts[i]) for i in ask]
            for i, answer in zip(ask, answers, strict=False):
                held[i] = bool(answer)
        return next((i for i, known in enumerate(held) if not known), len(held))

    def cool(self, keys: Sequence[CacheKey | str]) -> int:
        """ "This conversation ended": its entries become the first to go in tiers with an
        eviction policy (they stay usable until then). Returns how many were found."""
        texts = [str(_string(k)) for k in keys]
        cooled = 0
        for tier in self.tiers:
            if hasattr(tier, "cool"):
                cooled += self._call(tier, "cool", tier.cool, texts) or 0
        return cooled

    def end_session(self, tenant: str, session: str) -> int:
        """The application's "conversation ended", by session id: cools the entries that only
        this session read (recorded by `kv_pages` calls given `session=`, or by the caller with
        `sessions.read`); entries other sessions read too stay warm. Session ids are scoped by
        tenant. Returns how many of the cooled entries were cached."""
        return self.cool(self.sessions.end(tenant, session))

    # -- housekeeping --------------------------------------------------------------------------

    def health(self) -> dict[str, str]:
        """Degraded components and why (empty when all is well), cheap enough for every
        health probe: the generations (answers miss while they cannot be read; a live probe)
        and each tier that failed a call in the last `_RECENT_ERROR_S` seconds."""
        problems: dict[str, str] = {}
        reason = self.generations.problem()
        if reason is not None:
            problems["generations"] = f"{reason}; answers miss until it is back"
        now = time.monotonic()
        for name, (when, what) in list(self._last_errors.items()):
            if now - when <= _RECENT_ERROR_S:
                problems[name] = f"{what} failed {now - when:.1f}s ago; served by the other tiers"
        for component in ("generations", *(t.name for t in self.tiers)):
            self.metrics.degraded.labels(component).set(int(component in problems))
        return problems

    def check(self) -> dict[str, str]:
        """`health()` and each tier's full `check()` (indexes against data: slow on a big
        SSD tier, for operators and tests, not for probes)."""
        problems = self.health()
        for tier in self.tiers:
            found = self._call(tier, "check", tier.check, on_error=["check raised"])
            if found:
                problems[tier.name] = "; ".join([problems.get(tier.name, ""), *found]).lstrip("; ")
        return problems

    def refresh_gauges(self) -> None:
        for tier in self.tiers:
            stats = self._call(tier, "stats", tier.stats)
            if stats is not None:
                self.metrics.bytes.labels(tier.name).set(stats.bytes)
                self.metrics.evictions.labels(tier.name).set(stats.evictions)

    def close(self) -> None:
        self._refills.shutdown(wait=True)
        for tier in self.tiers:
            self._call(tier, "close", tier.close)

    def _renewed_ttl(self, key: str) -> float | None:
        with self._renew_lock:
            return self._renew.get(key)

    def _demoter(self, lower: Tier) -> Callable[[str, bytes, float | None, int | None], None]:
        def demote(key: str, value: bytes, ttl_left_s: float | None, _written: int | None) -> None:
            if ttl_left_s is not None and ttl_left_s <= 0:
                return
            if self._call(lower, "put", lower.put, key, value, ttl_s=ttl_left_s):
                self.metrics.demotions.labels(lower.name).inc()

        return demote

    def _call(
        self,
        tier: Tier,
        op: str,
        action: Callable[..., Any],
        *args: Any,
        on_error: Any = None,
        **kwargs: Any,
    ) -> Any:
        """`action(*args, **kwargs)`, or `on_error` if it raised (a miss, a refused write)."""
        started = time.perf_counter()
        try:
            return action(*args, **kwargs)
        except Exception as error:  # a tier must never fail the request: count, carry on
            self.metrics.errors.labels(tier.name, op).inc()
            self._last_errors[tier.name] = (time.monotonic(), f"{op} ({type(error).__name__})")
            return on_error
        finally:
            self.metrics.latency.labels(tier.name, op).observe(time.perf_counter() - started)

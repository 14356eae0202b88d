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

The seams, each in its own module: the guarded tier calls and the failures `health()` reports
(`tier_health.py`), renew-on-hit TTLs (`ttl_renewals.py`), promotion on hit (`promotion.py`:
two rules, one for `get`, one for `get_chain`), chain reads (`chain_reads.py`), and the
background refill after an invalidation (`refills.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cache_runtime.chain_reads import held_run_length, read_leading_run
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
from cache_runtime.pool import PoolPolicy
from cache_runtime.promotion import Promotions
from cache_runtime.refills import refill_answer
from cache_runtime.sessions import TenantSessionPages
from cache_runtime.tier_health import TierCalls
from cache_runtime.tiers.base import Tier
from cache_runtime.ttl_renewals import RenewOnHitTtls, TtlMode

_KINDS = frozenset(k.kind for k in (ExactKey, EmbeddingKey, SemanticKey, PrefixKey))


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`generations`: where answers' counters live; by default the Redis tier's
        (`RedisTier.generations()`, shared with every process using that Redis), else this
        process's own (`LocalGenerations`: no other process can invalidate). `sessions`: what
        each conversation read (`end_session`); a default `TenantSessionPages()` when None.
        `clock`: when a tier's failure happened, for `health()` (tests pass a fake one)."""
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
        self._call = TierCalls(self.metrics, clock)  # every call into a tier goes through it
        self._renew = RenewOnHitTtls()
        self._promotions = Promotions(self.tiers, self._call, self.metrics, self._renew)
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
                self._promotions.into_every_tier_above(text, raw, depth, _string(parent))
                return Lookup(value, tier.name, stamp)
        if scope is not None and stamp is None:
            stamp, _ = self._read(scope)
        self._renew.forget(text)  # gone from every tier: its renew-on-hit TTL goes too
        return Lookup(None, None, stamp)

    def _read(self, scope: AnswerScope, tier: Tier | None = None) -> tuple[Stamp | None, Any]:
        """The generations of `scope` (and the value `tier` holds, in the same round trip)."""
        also = tier.redis_key(scope.key) if tier is not None else None  # type: ignore[attr-defined]
        stamp, value = self.generations.read(scope, also)
        if stamp is None:
            kind = key_kind(scope.key)
            self.metrics.lookups.labels("generations", kind, "unvalidated").inc()
        return stamp, value

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
        chain = read_leading_run(self.tiers, self._call, self.metrics, texts)
        run = len(chain)
        self._promotions.chain_into_top_tier(texts[:run], chain, [_string(parent), *texts][:run])
        return [(value, self.tiers[depth].name) for value, depth in chain]

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
        self._renew.record(text, ttl_s, ttl_mode)
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
        return self._refills.submit(refill_answer, self, text, refill, template, put_options)

    def delete(self, key: CacheKey | str) -> bool:
        """`invalidate` without a refill; whether a tier held a copy. The copies are deleted
        too, to free their space (an answer's would never be served again anyway)."""
        text = str(_string(key))
        if key_kind(text) in ANSWER_KINDS:
            self.generations.bump(("key", text))
        self._renew.forget(text)
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
        return held_run_length(self.tiers, self._call, [page.to_string() for page in pages])

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

    def end_idle_sessions(self) -> int:
        """The idle end (`sessions.idle_ended`): cools the entries only a conversation idle for
        the tracker's timeout read, before a request can evict by them. Returns how many of
        them were cached."""
        ended = self.sessions.idle_ended()
        return self.cool(ended) if ended else 0

    # -- housekeeping --------------------------------------------------------------------------

    def health(self) -> dict[str, str]:
        """Degraded components and why (empty when all is well), cheap enough for every
        health probe: the generations (answers miss while they cannot be read; a live probe)
        and each tier that failed a call in the last `tier_health.RECENT_ERROR_S` seconds, on
        the cache's `clock`."""
        problems: dict[str, str] = {}
        reason = self.generations.problem()
        if reason is not None:
            problems["generations"] = f"{reason}; answers miss until it is back"
        problems.update(self._call.recent_failures())
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
            if isinstance(policy := getattr(tier, "policy", None), PoolPolicy):
                self.metrics.publish_pool(tier.name, policy)

    def close(self) -> None:
        self._refills.shutdown(wait=True)
        for tier in self.tiers:
            self._call(tier, "close", tier.close)

    def _demoter(self, lower: Tier) -> Callable[[str, bytes, float | None, int | None], None]:
        def demote(key: str, value: bytes, ttl_left_s: float | None, _written: int | None) -> None:
            if ttl_left_s is not None and ttl_left_s <= 0:
                return
            if self._call(lower, "put", lower.put, key, value, ttl_s=ttl_left_s):
                self.metrics.demotions.labels(lower.name).inc()

        return demote

"""HybridCache: memory -> SSD -> Redis behind one get/put, degrading instead of failing.

- Lookup goes down the tiers; a hit below the top is promoted (copied) into every tier above.
- Writes go to the tiers in `write_through`; the others receive values when they are evicted from
  the tier above (write-back / demotion), so a cold value leaves memory for SSD, not for nowhere.
- Any exception from a tier is counted and treated as a miss or a refused write: a broken SSD or
  an unreachable Redis makes the cache smaller, never the request fail.
- `invalidate(key, refill)` removes a key everywhere at once and recomputes it in the background
  ("update the source, invalidate, refill"); until the refill lands, lookups miss — a stale value
  is never served after `invalidate` returns, here or in another process (the deletes, fences,
  invalidation feed and Redis tombstones that make it so are `hybrid_invalidation.py`).
- Each deletion and each put leaves a fence with its time (`fences.py`), and a copy in flight
  (a promotion, a demotion, an older refill) of a value older than the key's fence is dropped:
  an old value never lands over a newer write or after a delete.
- A tier that refuses a put drops its older value of the key (the `Tier.put` contract), and a
  put deletes the key from the tiers outside `write_through`: an older copy left in any tier
  would be served once the faster tiers lose the new one.
- With an `InvalidationFeed` (`invalidation.py`), answers are not read from this process's own
  tiers while it may have missed another process's delete.
- A promoted value keeps the expiry it had in the tier it came from.
- TTL per entry: fixed (expires `ttl_s` after the write) or renew-on-hit (each hit resets it).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from cache_runtime.fences import Fences
from cache_runtime.hybrid_invalidation import (
    ANSWER_KINDS,
    UNKNOWN,
    Invalidation,
    checks_tombstones,
    key_kind,
)
from cache_runtime.invalidation import InvalidationFeed
from cache_runtime.keys import CacheKey, ExactKey, PrefixKey, SemanticKey
from cache_runtime.metrics import CacheMetrics
from cache_runtime.sessions import TenantSessionPages
from cache_runtime.tiers.base import Tier

TtlMode = Literal["fixed", "renew"]


class HybridCache(Invalidation):
    """Tiers from fastest to slowest; `write_through` names the tiers every put writes to
    (default: all). The others are filled by demotion and promotion only."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        write_through: Sequence[str] | None = None,
        metrics: CacheMetrics | None = None,
        refill_workers: int = 2,
        feed: InvalidationFeed | None = None,
        sessions: TenantSessionPages | None = None,
    ) -> None:
        """`feed`: the Redis stream through which this process's deletes reach the other
        processes' own tiers and theirs reach it (`invalidation.py`); None for a cache no
        other process shares. `sessions`: what each conversation read (`end_session`), with
        its bounds; a default `TenantSessionPages()` when None."""
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
        # what each live conversation read: `end_session` cools the entries only it read
        self.sessions = sessions if sessions is not None else TenantSessionPages()
        self._renew: dict[str, float] = {}  # keys with renew-on-hit TTL -> their TTL
        self._renew_lock = threading.Lock()
        self._fences = Fences()  # what keeps copies of older values from landing
        self._copy_lock = self._fences.lock  # held by fence checks and the copies they guard
        self._refills = ThreadPoolExecutor(refill_workers, thread_name_prefix="preheat-refill")
        for upper, lower in zip(self.tiers, self.tiers[1:], strict=False):
            if hasattr(upper, "on_evict"):
                upper.on_evict = self._demoter(lower)
        # the tiers only this process (or node) sees: what the feed keeps in step
        self._own_tiers = [t for t in self.tiers if not getattr(t, "shared", False)]
        self._shared_puts: OrderedDict[str, float] = OrderedDict()  # see `_note_shared_put`
        self._feed = feed
        if feed is not None:
            feed.start(self._apply_remote_deletes, self._drop_own_answers)

    # -- core ----------------------------------------------------------------------------------

    def get(self, key: CacheKey | str, parent: CacheKey | str | None = None) -> bytes | None:
        """The value from the fastest tier holding it, promoted into the tiers above; or None.

        `parent`: for a KV page, the page before it (its prefix). A promoted page is then
        linked to its parent in the tiers above, so the memory tier keeps the chain
        prefix-closed (never evicts the parent first, refuses the page if the parent is not
        there). A prefix key holds a hash of its parent's, not the parent's key, so the caller,
        which walks the chain in order, is the one that knows it."""
        return self.get_with_tier(key, parent)[0]

    def get_with_tier(
        self, key: CacheKey | str, parent: CacheKey | str | None = None
    ) -> tuple[bytes | None, str | None]:
        """`get`, also naming the tier that answered (None on a miss): what a load cost."""
        text = key if isinstance(key, str) else key.to_string()
        parent_text = parent if parent is None or isinstance(parent, str) else parent.to_string()
        kind = key_kind(text)
        started = time.monotonic_ns()
        # another process may have deleted an answer that this process has not heard of yet
        unsure = self._feed is not None and kind in ANSWER_KINDS and not self._feed.healthy()
        for depth, tier in enumerate(self.tiers):
            if unsure and tier in self._own_tiers:
                self.metrics.lookups.labels(tier.name, kind, "skipped").inc()
                continue
            value = self._call(tier, "get", tier.get, text)
            hit = value is not None
            self.metrics.lookups.labels(tier.name, kind, "hit" if hit else "miss").inc()
            if hit:
                renew = self._renewed_ttl(text)
                if renew is not None:
                    self._call(tier, "touch", tier.touch, text, renew)
                if depth:
                    ttl = renew
                    if ttl is None:
                        ttl = self._call(tier, "ttl", tier.ttl_left, text, on_error=UNKNOWN)
                    if ttl is not UNKNOWN:  # an unknown expiry must not become "never"
                        self._promote(
                            text, value, ttl, self.tiers[:depth], since_ns=started,
                            parent=parent_text,
                        )  # fmt: skip
                return value, tier.name
        with self._renew_lock:  # gone from every tier: its renew-on-hit TTL goes too (a put
            self._renew.pop(text, None)  # racing this miss then expires unrenewed: a miss)
        return None, None

    def _promote(
        self,
        key: str,
        value: bytes,
        ttl: float | None,
        uppers: Sequence[Tier],
        since_ns: int,
        parent: str | None = None,
    ) -> None:
        if ttl is not None and ttl <= 0:
            return  # expired (or gone) meanwhile: nothing worth copying
        with self._copy_lock:
            if self._fences.stale(key, since_ns):
                return  # written or deleted while we were reading: do not copy the old value
            for upper in uppers:
                if self._copy_into(upper, key, value, ttl, since_ns, parent):
                    self.metrics.promotions.labels(upper.name).inc()

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
        since_ns: int | None = None,
    ) -> bool:
        """Write to the write-through tiers; True if at least one stored it. `hint`: see
        `policies.Hint` (for a KV page: `Hint.TAIL` when it is the prompt's last page).

        `since_ns`: `time.monotonic_ns()` when the caller read what `value` was computed from
        (the lookup that missed, before generating the answer). If the key was invalidated or
        written since, the value may come from the old source: it is not stored (False,
        counted as "superseded"), so an answer computed before an invalidation never lands
        after it. The same holds for an invalidation that runs while this put is writing:
        the put then deletes what it wrote and returns False; and for an answer invalidated
        by another process since (`_write_tiers`), whose Redis tier refuses it on the server
        (False, counted as "invalidated")."""
        text = key if isinstance(key, str) else key.to_string()
        parent_text = parent if parent is None or isinstance(parent, str) else parent.to_string()
        kind = key_kind(text)
        # a semantic bucket is merged into what it holds when written: only a delete since the
        # lookup makes the new entry stale (a write of the bucket since does not)
        stale = self._fences.deleted_since if kind == "semantic" else self._fences.stale
        with self._copy_lock:  # check and fence at once: no invalidation can fall between
            if since_ns is not None and (
                stale(text, since_ns) or (kind == "semantic" and self._fences.writing(text))
            ):  # (two writes of a bucket at once would both end superseded: it would go)
                self.metrics.writes.labels("all", kind, "superseded").inc()
                return False
            # no delete of the key is running (else stale): the tombstones of this process's
            # deletes settled before the lookup do not refuse it (`RedisTier.own_mark`)
            own_marks = self._own_marks(text, since_ns) if since_ns is not None else {}
            mine = self._fences.begin_write(text)  # older copies in flight are dropped now
        stored = invalidated = False
        try:  # from here on, `end_write` must run: a delete of the key waits for it
            with self._renew_lock:
                if ttl_mode == "renew" and ttl_s is not None:
                    self._renew[text] = ttl_s
                else:
                    self._renew.pop(text, None)
            stored, invalidated = self._write_tiers(
                text, value, kind, since_ns, own_marks,
                ttl_s=ttl_s, pinned=pinned, parent=parent_text, hint=hint,
            )  # fmt: skip
        finally:
            with self._copy_lock:
                superseded = self._fences.end_write(text, mine)
                if self._feed is not None and kind in ANSWER_KINDS:
                    self._note_shared_put(text)
        if superseded:
            # An invalidation or another put ran while this one was writing: its deletes (or
            # writes) may have reached a tier before this put's write, and this value may
            # come from the old source, or be older than the other put's. It goes (a miss,
            # never a wrong answer; two racing puts of a key both end so). An invalidation
            # also waits for this put and deletes again (`_delete`): none is served after it.
            self._delete(text)
            self.metrics.writes.labels("all", kind, "superseded").inc()
            return False
        if invalidated:
            # Another process invalidated the key after this lookup began; this process may
            # not have heard yet (the feed), so its own tiers may hold an older value too
            self._delete(text, publish=False, tiers=self._own_tiers)
            self.metrics.writes.labels("all", kind, "invalidated").inc()
            return False
        return stored

    def _write_tiers(
        self,
        text: str,
        value: bytes,
        kind: str,
        since_ns: int | None,
        own_marks: dict[str, str],
        **options: Any,
    ) -> tuple[bool, bool]:
        """`put`'s tier writes: (stored by at least one tier, invalidated elsewhere).

        An answer with `since_ns` goes to the shared tiers first, each written only if no
        process invalidated it since the lookup (`RedisTier.put_unless_invalidated`, checked
        on the server, which dates the lookup on its own clock): if one was, nothing is
        written.
        In-process fences cannot see another process's invalidation until the feed brings it,
        and a value written to Redis in that window would be served to every process."""
        tiers: list[Tier] = self.tiers
        guarded = since_ns is not None and kind in ANSWER_KINDS
        if guarded:
            tiers = sorted(self.tiers, key=lambda tier: not checks_tombstones(tier))
        stored = False
        for tier in tiers:
            if tier.name not in self.write_through:  # an older promoted or demoted copy
                if checks_tombstones(tier):  # cleared, not invalidated: no tombstone
                    self._call(tier, "delete", tier.delete, text, mark=False)
                else:
                    self._call(tier, "delete", tier.delete, text)
                continue
            if guarded and checks_tombstones(tier):
                assert since_ns is not None
                # a semantic bucket is read, extended and written back: from this process's
                # tiers, current only up to the feed's last catch-up
                outcome = self._guarded_put(
                    tier, text, value, options["ttl_s"], since_ns,
                    read_here=kind == "semantic", own_mark=own_marks.get(tier.name, ""),
                )  # fmt: skip
                if outcome == "invalidated":
                    return False, True
                ok = outcome == "stored"
            else:
                ok = self._call(tier, "put", tier.put, text, value, **options)
            self.metrics.writes.labels(tier.name, kind, "stored" if ok else "refused").inc()
            stored = stored or bool(ok)  # a refusing tier drops its older value (`Tier.put`)
        return stored, False

    # -- lookups by key kind -------------------------------------------------------------------

    def get_exact(self, tenant: str, model_id: str, prompt: str) -> bytes | None:
        return self.get(ExactKey.of(tenant, model_id, prompt))

    def get_semantic(self, key: SemanticKey, verify: Callable[[bytes], bool]) -> bytes | None:
        """A semantic hit only if `verify(value)` accepts it (the caller checks the stored
        prompt's similarity, issue 6): an unverified near-match is never returned."""
        value = self.get(key)
        if value is None:
            return None
        if verify(value):
            return value
        self.metrics.lookups.labels("verify", "semantic", "rejected").inc()
        return None

    def longest_prefix(self, pages: Sequence[PrefixKey]) -> int:
        """How many leading pages of a chain are cached (a page is usable only after all before
        it); stops at the first miss."""
        count = 0
        for page in pages:
            text = page.to_string()
            if not any(self._call(t, "contains", t.contains, text) for t in self.tiers):
                break
            count += 1
        return count

    def cool(self, keys: Sequence[CacheKey | str]) -> int:
        """ "This conversation ended": its entries become the first to go in tiers with an
        eviction policy (they stay usable until then). Returns how many were found."""
        texts = [k if isinstance(k, str) else k.to_string() for k in keys]
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

    def refresh_gauges(self) -> None:
        for tier in self.tiers:
            stats = self._call(tier, "stats", tier.stats)
            if stats is not None:
                self.metrics.bytes.labels(tier.name).set(stats.bytes)
                self.metrics.evictions.labels(tier.name).set(stats.evictions)

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
        self._refills.shutdown(wait=True)
        for tier in self.tiers:
            self._call(tier, "close", tier.close)

    def _renewed_ttl(self, key: str) -> float | None:
        with self._renew_lock:
            return self._renew.get(key)

    def _demoter(self, lower: Tier) -> Callable[[str, bytes, float | None, int | None], None]:
        def demote(
            key: str, value: bytes, ttl_left_s: float | None, written_ns: int | None
        ) -> None:
            if ttl_left_s is not None and ttl_left_s <= 0:
                return
            if (
                self._feed is not None
                and key_kind(key) in ANSWER_KINDS
                and not self._feed.healthy()
            ):
                return  # it may have been invalidated unheard: not carried to a tier others read
            with self._copy_lock:
                if written_ns is not None and self._fences.stale(key, written_ns):
                    return  # written again or deleted after this value was written: stale
                if self._copy_into(lower, key, value, ttl_left_s, written_ns):
                    self.metrics.demotions.labels(lower.name).inc()

        return demote

    def _copy_into(
        self,
        tier: Tier,
        key: str,
        value: bytes,
        ttl: float | None,
        since_ns: int | None,
        parent: str | None = None,
    ) -> bool:
        """A promotion's or demotion's write. An answer going into a tier that keeps tombstones
        (Redis) is written only if no process invalidated it since `since_ns` (when the value
        was read or written here), nor since this process's own tiers last caught up with the
        others' deletes (the feed), whichever is earlier: an evicted answer must not carry an
        old value back into Redis, even when the invalidation's publish is late. Copies
        without a time go as ever."""
        if since_ns is not None and key_kind(key) in ANSWER_KINDS and checks_tombstones(tier):
            own_mark = tier.own_mark(key, since_ns)  # type: ignore[attr-defined]
            outcome = self._guarded_put(tier, key, value, ttl, since_ns, True, own_mark)
            return outcome == "stored"
        return bool(self._call(tier, "put", tier.put, key, value, ttl_s=ttl, parent=parent))

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
        except Exception:  # a tier must never fail the request: count, then carry on
            self.metrics.errors.labels(tier.name, op).inc()
            return on_error
        finally:
            self.metrics.latency.labels(tier.name, op).observe(time.perf_counter() - started)

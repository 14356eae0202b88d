"""How `HybridCache` deletes: everywhere at once, in this process and in every other one.

`HybridCache` inherits `Invalidation` (a mixin: these methods share the cache's tiers, fences
and locks; they are apart so that `hybrid.py` reads as lookups and writes, and this module as
the consistency protocol around them):

- `delete`/`invalidate` fence the key, delete it from the shared tiers, publish the delete to
  the other processes (the `InvalidationFeed`), delete it from this process's own tiers, fence
  again and delete again, and wait for puts of the key that were writing when it began: no copy
  in flight (a promotion, a demotion, an older refill) and no put that raced it lands after.
- Another process's deletes arrive through the feed (`_apply_remote_deletes`); if the feed may
  have missed some, every answer in this process's own tiers goes (`_drop_own_answers`).
- Answers written to Redis carry the time of the lookup they were computed from, and Redis
  refuses one invalidated since by any process (`_guarded_put`; the tombstones of
  `tiers/redis_tombstones.py`): fences are per process, and another process's invalidation
  reaches this one's fences only by the feed.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cache_runtime.keys import CacheKey, parse_key
from cache_runtime.tiers.base import Tier

if TYPE_CHECKING:
    from cache_runtime.fences import Fences
    from cache_runtime.invalidation import InvalidationFeed
    from cache_runtime.metrics import CacheMetrics

# How long an invalidation waits for puts of its key that were writing when it began (tier
# calls have their own, shorter timeouts: Redis's socket timeout, the SSD's lock_timeout_s)
_WRITE_WAIT_S = 30.0
_SHARED_PUTS_LIMIT = 100_000  # answers this process put lately, for remote deletes
# A delete's own duration and clock skew between processes, for the wall times of remote
# deletes (tombstone checks have their own allowance: `RedisTier.put_unless_invalidated`)
_PUT_SKEW_S = 1.0
UNKNOWN = object()  # what a tier call that raised returns where None means something
_NEVER_NS = -(1 << 62)  # a monotonic time before anything
# Keys that can go stale (answers); KV pages ("prefix") are keyed by their tokens and weights
ANSWER_KINDS = frozenset({"exact", "semantic"})


def checks_tombstones(tier: Tier) -> bool:
    """Whether `tier` can refuse an answer invalidated by another process (`RedisTier`)."""
    return callable(getattr(tier, "put_unless_invalidated", None))


def key_kind(key: str) -> str:
    try:
        return parse_key(key).kind
    except ValueError:
        return "other"


class Invalidation:
    """`HybridCache`'s deletes, invalidations and tombstone-guarded writes (see the module
    docstring). Uses the cache's attributes below; `HybridCache.__init__` sets them."""

    tiers: list[Tier]
    metrics: CacheMetrics
    _own_tiers: list[Tier]
    _fences: Fences
    _copy_lock: threading.RLock
    _feed: InvalidationFeed | None
    _renew: dict[str, float]
    _renew_lock: threading.Lock
    _refills: ThreadPoolExecutor
    _shared_puts: OrderedDict[str, float]
    _call: Callable[..., Any]
    put: Callable[..., bool]

    def delete(self, key: CacheKey | str) -> bool:
        text = key if isinstance(key, str) else key.to_string()
        return self._delete(text)[0]

    def _delete(
        self, text: str, publish: bool = True, tiers: Sequence[Tier] | None = None
    ) -> tuple[bool, int]:
        """Delete everywhere; returns (whether a tier held it, the fence left).

        Fence, delete, fence again, and delete again from every tier a promotion can write
        (all but the last): a lookup that began after the first fence may have read the old
        value from a tier not deleted yet and promoted it into one already cleared. Copies
        take the copy lock to check the fence and write, so once the second fence is set none
        is half done: what landed before it goes with the second delete, and none lands after.
        Puts do not write under the copy lock, so a put that began before this delete may
        still be writing: it is waited for (at most `_WRITE_WAIT_S`), and the deletes run
        once more. That put finds its fence overtaken and returns False.
        The deletes run outside the copy lock: a slow or unreachable tier would stall every
        copy meanwhile. (Copies do call tiers under it, to check and write as one; no tier
        takes the copy lock while holding a lock of its own: the memory tier and the SSD hand
        on their evictions after releasing theirs.)

        `publish`: tell the other processes (the feed), unless this delete is one of theirs;
        `tiers`: the tiers to delete from (default: all)."""
        tiers = self.tiers if tiers is None else tiers
        with self._renew_lock:
            self._renew.pop(text, None)
        with self._copy_lock:  # until `end_delete`, no copy or put with a lookup time lands
            first = self._fences.begin_delete(text)
        try:
            found = self._delete_fenced(text, tiers, publish)
            with self._copy_lock:  # puts that began before this delete and are still writing
                overtaken, in_time = self._fences.wait_for_writes(text, first, _WRITE_WAIT_S)
            if not in_time:
                self.metrics.errors.labels("all", "invalidate_wait").inc()
            if overtaken:  # what they wrote after the deletes above goes now
                with self._copy_lock:
                    self._fences.stamp(text, delete=True)
                self._delete_fenced(text, tiers, publish=False)
        finally:
            with self._copy_lock:
                fence = self._fences.end_delete(text)
            for tier in tiers:  # no old copy is left in them (`RedisTier.settle`)
                if checks_tombstones(tier):
                    self._call(tier, "settle", tier.settle, text)  # type: ignore[attr-defined]
        return found, fence

    def _apply_remote_deletes(self, deletions: list[tuple[str, float]]) -> None:
        """Another process deleted these keys (each with the wall time it published the
        delete): delete them from this process's own tiers, and from the shared ones too where
        this process's last put of the key ended after that delete began (less
        `_PUT_SKEW_S`): that put may have reached Redis after the delete, with a value computed
        before it. Only then: every process deleting from Redis would also wipe the refill of
        the process that invalidated."""
        for key, deleted_at in deletions:
            with self._copy_lock:
                put_ended = self._shared_puts.get(key)
            late = put_ended is not None and put_ended >= deleted_at - _PUT_SKEW_S
            self._delete(key, publish=False, tiers=None if late else self._own_tiers)

    def _note_shared_put(self, key: str) -> None:
        """Remember when this process's put of an answer ended (wall time, copy lock held):
        the last `_SHARED_PUTS_LIMIT` answers, for the feed's retention. KV pages cannot go
        stale: not noted, so they cannot push answers out."""
        now = time.time()
        self._shared_puts[key] = now
        self._shared_puts.move_to_end(key)
        horizon = now - (self._feed.retention_s if self._feed is not None else 0.0)
        while self._shared_puts and (
            len(self._shared_puts) > _SHARED_PUTS_LIMIT
            or next(iter(self._shared_puts.values())) < horizon
        ):
            self._shared_puts.popitem(last=False)

    def _drop_own_answers(self) -> bool:
        """The feed may have missed deletions: drop every answer this process's own tiers
        hold (KV pages stay: they cannot go stale). Fenced, so no copy in flight lands after.
        False if a tier could not list or delete them all (a tier without `keys()` cannot)."""
        complete = True
        for tier in self._own_tiers:
            listing = getattr(tier, "keys", None)
            keys = UNKNOWN
            if listing is not None:
                keys = self._call(tier, "keys", listing, on_error=UNKNOWN)
            if keys is UNKNOWN:
                complete = False
                continue
            for key in keys:
                if key_kind(key) in ANSWER_KINDS:
                    with self._copy_lock:
                        self._fences.stamp(key, delete=True)
                    deleted = self._call(tier, "delete", tier.delete, key, on_error=UNKNOWN)
                    complete = complete and deleted is not UNKNOWN
        return complete

    def _delete_fenced(self, text: str, tiers: Sequence[Tier], publish: bool) -> bool:
        """Delete from `tiers`, the shared ones first, then tell the other processes
        (`publish`, through the feed) before this process's own tiers, which can be slow (an
        SSD waits for its node's lock): another process may not write back an old copy of its
        own for longer than it takes the feed to tell it; then fence, and delete again from the
        tiers a promotion writes."""
        shared = [tier for tier in tiers if tier not in self._own_tiers]
        own = [tier for tier in tiers if tier in self._own_tiers]
        results = [self._call(tier, "delete", tier.delete, text) for tier in shared]
        if publish:
            self._publish(text)
        results += [self._call(tier, "delete", tier.delete, text) for tier in own]
        with self._copy_lock:
            self._fences.stamp(text, delete=True)
        for tier in tiers:
            if tier is not self.tiers[-1]:  # the last tier is never promoted into
                self._call(tier, "delete", tier.delete, text)
        return any(results)

    def _publish(self, key: str) -> None:
        """Tell the other processes of this delete (the feed; a failure is retried by it)."""
        if self._feed is not None and not self._feed.publish([key]):
            self.metrics.errors.labels("all", "publish").inc()

    def invalidate(
        self,
        key: CacheKey | str,
        refill: Callable[[], bytes | None] | None = None,
        **put_options: object,
    ) -> Future[bool] | None:
        """Remove `key` from every tier now; if `refill` is given, recompute and store it in the
        background. Returns the refill's future (True when the new value was stored; a put or
        another invalidation of the key meanwhile supersedes it, here or, through Redis's
        tombstones, in another process after the refill began)."""
        text = key if isinstance(key, str) else key.to_string()
        _, mine = self._delete(text)
        if refill is None:
            return None
        with self._copy_lock:  # a write since `mine` supersedes the refill (see `store`)
            self._fences.begin_refill(text)

        def run() -> bool:
            started = time.monotonic_ns()  # before the refill reads its source
            try:
                return store(refill(), started)
            except Exception:
                self.metrics.refills.labels("failed").inc()
                return False
            finally:
                with self._copy_lock:
                    self._fences.end_refill(text)

        def store(value: bytes | None, started: int) -> bool:
            if value is None:
                self.metrics.refills.labels("empty").inc()
                return False
            with self._copy_lock:
                if self._fences.get(text) != mine:  # written or invalidated since: superseded
                    self.metrics.refills.labels("superseded").inc()
                    return False
                # another process's invalidation after `started` refuses it too (tombstones)
                options: dict[str, Any] = {"since_ns": started, **put_options}
                stored = self.put(key, value, **options)
            self.metrics.refills.labels("stored" if stored else "refused").inc()
            return stored

        return self._refills.submit(run)

    def _guarded_put(
        self,
        tier: Tier,
        key: str,
        value: bytes,
        ttl: float | None,
        since_ns: int,
        read_here: bool,
        own_mark: str,
    ) -> str:
        """`tier.put_unless_invalidated` of an answer whose source was read at `since_ns`;
        `read_here`: the value came from this process's own tiers, current only up to the
        feed's last catch-up, so it is checked from then if that is earlier (from the start of
        the clock, so refused, while the feed is unhealthy). Returns the outcome ("failed" if
        the call raised; "invalidated" for one taken back, whose delete is published too); an
        "invalidated" one is counted."""
        looked_up_ns = since_ns
        if read_here and self._feed is not None:
            applied = self._feed.applied_age()
            # unhealthy: current as of no time at all (long before any tombstone kept): refused
            current_ns = _NEVER_NS if applied is None else time.monotonic_ns() - int(applied * 1e9)
            looked_up_ns = min(looked_up_ns, current_ns)
        outcome = self._call(
            tier, "put", tier.put_unless_invalidated,  # type: ignore[attr-defined]
            key, value, ttl_s=ttl, looked_up_ns=looked_up_ns, own_mark=own_mark,
            on_error="failed",
        )  # fmt: skip
        if outcome == "taken_back":  # other processes may have read it meanwhile
            self._publish(key)
            outcome = "invalidated"
        if outcome == "invalidated":
            self.metrics.writes.labels(tier.name, key_kind(key), "invalidated").inc()
        return str(outcome)

    def _own_marks(self, key: str, since_ns: int) -> dict[str, str]:
        """tier name -> the tombstone this process's last delete of `key` left there, if that
        delete was complete before `since_ns`. Read under the copy lock after a fence check
        showed no delete of the key running."""
        tiers = [tier for tier in self.tiers if checks_tombstones(tier)]
        return {tier.name: tier.own_mark(key, since_ns) for tier in tiers}  # type: ignore[attr-defined]

"""HybridCache: memory -> SSD -> Redis behind one get/put, degrading instead of failing.

- Lookup goes down the tiers; a hit below the top is promoted (copied) into every tier above.
- Writes go to the tiers in `write_through`; the others receive values when they are evicted from
  the tier above (write-back / demotion), so a cold value leaves memory for SSD, not for nowhere.
- Any exception from a tier is counted and treated as a miss or a refused write: a broken SSD or
  an unreachable Redis makes the cache smaller, never the request fail.
- `invalidate(key, refill)` removes a key everywhere at once and recomputes it in the background
  ("update the source, invalidate, refill"); until the refill lands, lookups miss — a stale value
  is never served after `invalidate` returns. Copies that were in flight when it ran (a lookup
  about to promote, an eviction about to demote, an older refill) are dropped: each deletion
  and each put leaves a fence with its time, and a copy of a value older than the key's fence
  is not written (an old value never lands over a newer write or after a delete).
- A tier that refuses a put drops its older value of the key (the `Tier.put` contract), and a
  put deletes the key from the tiers outside `write_through`: an older copy left in any tier
  would be served once the faster tiers lose the new one.
- With an `InvalidationFeed` (`invalidation.py`), deletes reach the tiers other processes hold
  on their own, theirs reach this process's, and answers are not read from this process's own
  tiers while it may have missed one. The fence bookkeeping itself is `fences.py`.
- An answer put with the time of its lookup is written to Redis only if no process invalidated
  it since, checked on the server against the delete's tombstone (`RedisTier`): fences are
  per process, and another process's invalidation reaches this one's fences only by the feed.
- A promoted value keeps the expiry it had in the tier it came from.
- TTL per entry: fixed (expires `ttl_s` after the write) or renew-on-hit (each hit resets it).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

from cache_runtime.fences import Fences
from cache_runtime.invalidation import InvalidationFeed
from cache_runtime.keys import CacheKey, ExactKey, PrefixKey, SemanticKey, parse_key
from cache_runtime.metrics import CacheMetrics
from cache_runtime.sessions import SessionPages
from cache_runtime.tiers.base import Tier

TtlMode = Literal["fixed", "renew"]
# How long an invalidation waits for puts of its key that were writing when it began (tier
# calls have their own, shorter timeouts: Redis's socket timeout, the SSD's lock_timeout_s)
_WRITE_WAIT_S = 30.0
_SHARED_PUTS_LIMIT = 100_000  # answers this process put lately, for remote deletes
_PUT_SKEW_S = 1.0  # a delete's own duration and clock skew between processes and Redis
_UNKNOWN = object()  # what a tier call that raised returns where None means something
# Keys that can go stale (answers); KV pages ("prefix") are keyed by their tokens and weights
_ANSWER_KINDS = frozenset({"exact", "semantic"})


def _checks_tombstones(tier: Tier) -> bool:
    """Whether `tier` can refuse an answer invalidated by another process (`RedisTier`)."""
    return callable(getattr(tier, "put_unless_invalidated", None))


def key_kind(key: str) -> str:
    try:
        return parse_key(key).kind
    except ValueError:
        return "other"


class HybridCache:
    """Tiers from fastest to slowest; `write_through` names the tiers every put writes to
    (default: all). The others are filled by demotion and promotion only."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        write_through: Sequence[str] | None = None,
        metrics: CacheMetrics | None = None,
        refill_workers: int = 2,
        feed: InvalidationFeed | None = None,
        sessions: SessionPages[str] | None = None,
    ) -> None:
        """`feed`: the Redis stream through which this process's deletes reach the other
        processes' own tiers and theirs reach it (`invalidation.py`); None for a cache no
        other process shares. `sessions`: what each conversation read (`end_session`), with
        its bounds; a default `SessionPages()` when None."""
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
        self.sessions: SessionPages[str] = sessions if sessions is not None else SessionPages()
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
        unsure = self._feed is not None and kind in _ANSWER_KINDS and not self._feed.healthy()
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
                        ttl = self._call(tier, "ttl", tier.ttl_left, text, on_error=_UNKNOWN)
                    if ttl is not _UNKNOWN:  # an unknown expiry must not become "never"
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
                if self._feed is not None and kind in _ANSWER_KINDS:
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
        on the server, allowing `_PUT_SKEW_S` of clock skew): if one was, nothing is written.
        In-process fences cannot see another process's invalidation until the feed brings it,
        and a value written to Redis in that window would be served to every process."""
        tiers: list[Tier] = self.tiers
        guarded = since_ns is not None and kind in _ANSWER_KINDS
        if guarded:
            tiers = sorted(self.tiers, key=lambda tier: not _checks_tombstones(tier))
        stored = False
        for tier in tiers:
            if tier.name not in self.write_through:  # an older promoted or demoted copy
                if _checks_tombstones(tier):  # cleared, not invalidated: no tombstone
                    self._call(tier, "delete", tier.delete, text, mark=False)
                else:
                    self._call(tier, "delete", tier.delete, text)
                continue
            if guarded and _checks_tombstones(tier):
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
                if _checks_tombstones(tier):
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
            keys = _UNKNOWN
            if listing is not None:
                keys = self._call(tier, "keys", listing, on_error=_UNKNOWN)
            if keys is _UNKNOWN:
                complete = False
                continue
            for key in keys:
                if key_kind(key) in _ANSWER_KINDS:
                    with self._copy_lock:
                        self._fences.stamp(key, delete=True)
                    deleted = self._call(tier, "delete", tier.delete, key, on_error=_UNKNOWN)
                    complete = complete and deleted is not _UNKNOWN
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
        return self.cool(self.sessions.end((tenant, session)))

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
                and key_kind(key) in _ANSWER_KINDS
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
        if since_ns is not None and key_kind(key) in _ANSWER_KINDS and _checks_tombstones(tier):
            own_mark = tier.own_mark(key, since_ns)  # type: ignore[attr-defined]
            outcome = self._guarded_put(tier, key, value, ttl, since_ns, True, own_mark)
            return outcome == "stored"
        return bool(self._call(tier, "put", tier.put, key, value, ttl_s=ttl, parent=parent))

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
        feed's last catch-up, so it is checked from then if that is earlier. Returns the
        outcome ("failed" if the call raised); an "invalidated" one is counted."""
        since_s = self._lookup_wall(since_ns)
        if read_here and self._feed is not None:
            since_s = min(since_s, self._own_tiers_current())
        outcome = self._call(
            tier, "put", tier.put_unless_invalidated,  # type: ignore[attr-defined]
            key, value, ttl_s=ttl, since_s=since_s, own_mark=own_mark, on_error="failed",
        )  # fmt: skip
        if outcome == "invalidated":
            self.metrics.writes.labels(tier.name, key_kind(key), "invalidated").inc()
        return str(outcome)

    def _own_marks(self, key: str, since_ns: int) -> dict[str, str]:
        """tier name -> the tombstone this process's last delete of `key` left there, if that
        delete was complete before `since_ns`. Read under the copy lock after a fence check
        showed no delete of the key running."""
        tiers = [tier for tier in self.tiers if _checks_tombstones(tier)]
        return {tier.name: tier.own_mark(key, since_ns) for tier in tiers}  # type: ignore[attr-defined]

    @staticmethod
    def _lookup_wall(since_ns: int) -> float:
        """`since_ns` (monotonic) as wall seconds, less `_PUT_SKEW_S`: what a tombstone's time
        (the Redis server's clock) is compared with."""
        return time.time() - (time.monotonic_ns() - since_ns) / 1e9 - _PUT_SKEW_S

    def _own_tiers_current(self) -> float:
        """Wall seconds (less `_PUT_SKEW_S`) up to which this process's own tiers reflect every
        other process's delete: the feed's last catch-up; 0 while it is unhealthy, so that
        nothing read from them is taken for current. Needs a feed."""
        assert self._feed is not None
        applied = self._feed.applied_until()
        return 0.0 if applied is None else applied - _PUT_SKEW_S

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

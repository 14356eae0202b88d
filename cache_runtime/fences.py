"""Fences: per key, the time of its last put or delete, and the puts still writing it.

What keeps `HybridCache` from serving an old value. A copy of a value (a promotion after a
lookup, a demotion after an eviction, a background refill) is written only if its key's fence is
older than the value: a put or delete since then makes the copy stale. A put registers while it
writes, so that a delete can wait for the puts that began before it (a late write would
otherwise land after the delete). Every method expects `lock` held: the hybrid cache holds it
while a copy checks its fence and writes, so that no fence can fall between the two.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

_LIMIT = 10_000  # fences always kept, the newest
_TTL_NS = 10 * 1_000_000_000  # and every fence younger than this


class Fences:
    def __init__(self) -> None:
        # Re-entrant: a promotion into memory can evict there, and that eviction demotes below
        self.lock = threading.RLock()
        self._stamps: OrderedDict[str, int] = OrderedDict()  # key -> monotonic_ns, oldest first
        self._deletes: dict[str, int] = {}  # key -> its last delete's stamp (while it has one)
        self._deleting: dict[str, int] = {}  # key -> deletes in flight
        self._refilling: dict[str, int] = {}  # key -> refills in flight (their fences are kept)
        self._writing: dict[str, list[int]] = {}  # key -> the fences of its puts still writing
        self._writes_done = threading.Condition(self.lock)
        self._last = 0  # the newest stamp

    def get(self, key: str) -> int | None:
        """The key's fence (monotonic_ns), None if it has none (any copy may land)."""
        return self._stamps.get(key)

    def stale(self, key: str, since_ns: int) -> bool:
        """Whether the key was written or deleted at or after `since_ns`, or is being deleted
        (a value read meanwhile may come from a tier not cleared yet)."""
        return key in self._deleting or self._stamps.get(key, -1) >= since_ns

    def deleted_since(self, key: str, since_ns: int) -> bool:
        """Whether the key was deleted at or after `since_ns` (its delete ended then or later),
        or is being deleted; a write since does not count (for a value merged into what the key
        holds when it is written: a semantic bucket)."""
        return key in self._deleting or self._deletes.get(key, -1) >= since_ns

    def begin_delete(self, key: str) -> int:
        """A delete of `key` starts: until `end_delete`, every copy and put of it is stale."""
        self._deleting[key] = self._deleting.get(key, 0) + 1
        return self.stamp(key, delete=True)

    def end_delete(self, key: str) -> int:
        """The delete is complete in every tier; returns the key's fence from now."""
        left = self._deleting.pop(key) - 1
        if left:
            self._deleting[key] = left
        return self.stamp(key, delete=True)

    def stamp(self, key: str, delete: bool = False) -> int:
        """Fence `key` now (`delete`: for a delete), and forget fences nothing can need any
        more.

        A fence only has to outlive the copies in flight when it was set (a lookup or an
        eviction: milliseconds); ten seconds' worth is kept, and at least the newest
        `_LIMIT`. Pruning takes the oldest first, so it costs what it removes. A key with a
        refill in flight keeps its fence (the refill compares the one it started with)."""
        # strictly increasing: two equal stamps would hide a put or delete from another
        now = self._last = max(time.monotonic_ns(), self._last + 1)
        self._stamps[key] = now
        self._stamps.move_to_end(key)
        if delete:
            self._deletes[key] = now
        horizon = now - _TTL_NS
        held = 0
        while len(self._stamps) - held > _LIMIT:
            oldest, stamped = next(iter(self._stamps.items()))
            if stamped >= horizon:
                break
            if oldest in self._refilling:
                self._stamps.move_to_end(oldest)
                held += 1
                continue
            del self._stamps[oldest]
            self._deletes.pop(oldest, None)
        return now

    # -- puts in flight ------------------------------------------------------------------------

    def begin_write(self, key: str) -> int:
        """A put of `key` starts: fence it, and register until `end_write`. Returns its fence."""
        mine = self.stamp(key)
        self._writing.setdefault(key, []).append(mine)
        return mine

    def end_write(self, key: str, mine: int) -> bool:
        """The put that fenced `mine` is done; returns whether another put or a delete fenced
        the key meanwhile (its value may then have landed over a newer one, or after a delete)."""
        writing = self._writing[key]
        writing.remove(mine)
        if not writing:
            del self._writing[key]
        self._writes_done.notify_all()
        return self._stamps.get(key) != mine

    def writing(self, key: str) -> bool:
        """Whether a put of `key` is writing now."""
        return key in self._writing

    def wait_for_writes(self, key: str, before: int, timeout_s: float) -> tuple[bool, bool]:
        """Wait until no put of `key` that fenced before `before` is writing. Returns (whether
        one was, whether they all finished within `timeout_s`)."""

        def writing() -> bool:
            return any(started < before for started in self._writing.get(key, ()))

        if not writing():
            return False, True
        return True, self._writes_done.wait_for(lambda: not writing(), timeout=timeout_s)

    # -- refills in flight ---------------------------------------------------------------------

    def begin_refill(self, key: str) -> None:
        self._refilling[key] = self._refilling.get(key, 0) + 1

    def end_refill(self, key: str) -> None:
        left = self._refilling.pop(key) - 1
        if left:
            self._refilling[key] = left

    def __len__(self) -> int:
        return len(self._stamps)

    def __contains__(self, key: str) -> bool:
        return key in self._stamps

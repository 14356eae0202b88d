"""Eviction policies for KV prefix blocks: prefix-aware SLRU and ARC (the pool's hinted ones).

Each uses only the past of the trace plus what the application knows when a block is inserted
(`Hint.TAIL`: the block is the last of its request's prompt). They share the `EvictionPolicy`
contract, so the memory tier runs them and the simulator replays traces through the same objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from cache_runtime.key_queue import KeyQueue
from cache_runtime.policies import EvictionPolicy, Hint, Key, queue_victim


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixSLRU(EvictionPolicy):
    """Segmented LRU for KV prefix blocks, with cold insertion of request tails.

    - New blocks enter a probation segment; a block hit again moves to a protected segment
      (at most `protected_share` of the entries), whose overflow falls back to probation.
      Eviction takes probation's least recent first: one-off blocks never push out reused ones.
    - A block flagged `Hint.TAIL` (a request's last block) enters probation at its eviction end.
    - A block that returns shortly after being evicted (it is in the ghost history of the last
      `len(cache)` evictions) was reused after all and goes straight to protected.
    Uses only the past of the trace. Capacity in entries is learned at the first eviction (the
    tier evicts only when full), so the same object serves byte budgets and the simulator.

    Measured on the shipped Mooncake trace (`preheat bench cache`): above LRU and ARC at 10% and
    20% of unique blocks; at 1% and 5% ARC stays ahead: both are in the pool (`cache_runtime.pool`).
    """

    name = "prefix-slru"

    def __init__(self, protected_share: float = 0.8) -> None:
        if not 0 < protected_share < 1:
            raise ValueError("protected_share must be in (0, 1)")
        self.protected_share = protected_share
        self._probation = KeyQueue()
        self._protected = KeyQueue()
        self._ghosts = KeyQueue()
        self._capacity: int | None = None

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        # evicted recently and wanted again, or a live conversation's history
        if self._ghosts.discard(key) or hint == Hint.CONVERSATION:
            self._protected.add(key)
            self._rebalance()
            return
        self._probation.add(key)
        if hint == Hint.TAIL:
            self._probation.move_to_front(key)

    def on_access(self, key: Key, now: float) -> None:
        if self._probation.discard(key):
            self._protected.add(key)
            self._rebalance()
        else:
            self._protected.move_to_back(key)

    def on_access_many(self, keys: Sequence[Key]) -> None:
        """As `on_access` per key: every hit key ends in protected by last access; one
        rebalance after demotes the same keys (protected's least recent) that a rebalance per
        promotion would."""
        if _hits_to_end(keys, self._probation, self._protected):
            self._rebalance()

    def on_remove(self, key: Key) -> None:
        if self._probation.discard(key) or self._protected.discard(key):
            self._remember(key)

    def _remember(self, key: Key) -> None:
        """A ghost of `key`, gone from the cache; the ghosts as many as the entries."""
        self._ghosts.add(key)
        while len(self._ghosts) > max(len(self._probation) + len(self._protected), 1):
            self._ghosts.pop_front()

    def on_cold(self, key: Key) -> None:
        if self._protected.discard(key) or key in self._probation:
            self._probation.push_front(key)

    def _learn_capacity(self) -> None:
        """The size, at the first eviction (`victim` and `evict` share it)."""
        if self._capacity is None:
            self._capacity = len(self._probation) + len(self._protected)

    def resize(self, entries: int) -> None:
        """Protected's share of `entries`: its overflow goes back to probation at once."""
        if self._capacity is not None:
            self._capacity = entries
            self._rebalance()

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        self._learn_capacity()
        for segment in (self._probation, self._protected):
            found = queue_victim(segment, keep)
            if found is not None:
                return found
        return None

    def evict(self) -> Key | None:
        self._learn_capacity()
        for segment in (self._probation, self._protected):
            if segment:
                key = segment.pop_front()
                self._remember(key)
                return key
        return None

    def ranked(self) -> list[Key]:
        return [*self._probation, *self._protected]

    def _rebalance(self) -> None:
        entries = self._capacity or len(self._probation) + len(self._protected)
        excess = len(self._protected) - max(1, int(entries * self.protected_share))
        if excess <= 0:
            return
        # protected's least recent `excess` go to probation's recent end, oldest first
        protected, probation = self._protected, self._probation
        for _ in range(excess):
            probation.add(protected.pop_front())


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixARC(EvictionPolicy):
    """ARC (Megiddo & Modha, FAST'03) with request tails inserted at T1's eviction end.

    T1 holds blocks seen once recently, T2 blocks seen at least twice; ghosts B1/B2 remember what
    each evicted, and a ghost hit moves the target size `p` of T1 towards the side that would
    have kept the block. Replaying the Mooncake trace, the plain version (no hints) matches
    libCacheSim's ARC to three decimals, which is how this implementation was checked.
    """

    name = "prefix-arc"

    def __init__(self, tail_cold: bool = True) -> None:
        self.tail_cold = tail_cold
        self._t1 = KeyQueue()
        self._t2 = KeyQueue()
        self._b1 = KeyQueue()
        self._b2 = KeyQueue()
        self._p = 0.0
        self._capacity: int | None = None

    def _c(self) -> int:
        return self._capacity or max(1, len(self._t1) + len(self._t2))

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        c = self._c()
        # The adaptation step uses the ghost list sizes *with* the returning key, as in the paper.
        if key in self._b1:  # ghost of T1: the recency side was too small
            self._p = min(c, self._p + max(len(self._b2) / len(self._b1), 1))
            self._b1.remove(key)
            self._t2.add(key)
            return
        if key in self._b2:  # ghost of T2: the frequency side was too small
            self._p = max(0.0, self._p - max(len(self._b1) / len(self._b2), 1))
            self._b2.remove(key)
            self._t2.add(key)
            return
        if hint == Hint.CONVERSATION:  # a live conversation's history: read again next turn
            self._t2.add(key)
            return
        self._t1.add(key)
        if hint == Hint.TAIL and self.tail_cold:
            self._t1.move_to_front(key)

    def on_access(self, key: Key, now: float) -> None:
        if self._t1.discard(key):
            self._t2.add(key)
        else:
            self._t2.move_to_back(key)

    def on_access_many(self, keys: Sequence[Key]) -> None:
        """As `on_access` per key: every hit key ends at T2's recent end, by last access."""
        _hits_to_end(keys, self._t1, self._t2)

    def on_remove(self, key: Key) -> None:
        c = self._c()
        if self._t1.discard(key):
            self._b1.add(key)
        elif self._t2.discard(key):
            self._b2.add(key)
        self._trim_ghosts(c)

    def _trim_ghosts(self, c: int) -> None:
        """B1 at most c with T1, the four lists at most 2c (the paper's bounds)."""
        while len(self._b1) + len(self._t1) > c and self._b1:
            self._b1.pop_front()
        while len(self._b1) + len(self._b2) + len(self._t1) + len(self._t2) > 2 * c and self._b2:
            self._b2.pop_front()

    def on_cold(self, key: Key) -> None:
        if self._t2.discard(key) or key in self._t1:
            self._t1.push_front(key)

    def resize(self, entries: int) -> None:
        """c for `entries`: the target p and the ghosts within the paper's bounds for it."""
        if self._capacity is not None:
            self._capacity = entries
            self._p = min(self._p, float(entries))
            self._trim_ghosts(entries)

    def _t1_first(self) -> bool:
        """Whether T1 gives up a key first: while it exceeds its target p, or T2 is empty
        (`victim` and `evict` share the rule); the size is learned at the first eviction."""
        if self._capacity is None:
            self._capacity = len(self._t1) + len(self._t2)
        return bool(self._t1) and (len(self._t1) > self._p or not self._t2)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        for segment in (self._t1, self._t2) if self._t1_first() else (self._t2, self._t1):
            found = queue_victim(segment, keep)
            if found is not None:
                return found
        return None

    def evict(self) -> Key | None:
        t1_first = self._t1_first()
        c = self._c()  # before the pop, as `on_remove` reads it
        if t1_first:
            key = self._t1.pop_front()
            self._b1.add(key)
        elif self._t2:
            key = self._t2.pop_front()
            self._b2.add(key)
        else:
            return None
        self._trim_ghosts(c)
        return key

    def ranked(self) -> list[Key]:
        return [*self._t1, *self._t2]


def _hits_to_end(keys: Sequence[Key], source: KeyQueue, target: KeyQueue) -> int:
    """Apply hits that move a key from `source` to `target`'s recent end, or to that end if it
    is in `target` already (ARC's T1 -> T2, SLRU's probation -> protected), in access order, so
    the final order is by last access. Hits on keys removed since (a concurrent delete) are
    skipped. Returns how many moved from `source`."""
    promoted = 0
    for key in keys:
        if source.discard(key):
            target.add(key)
            promoted += 1
        elif key in target:
            target.move_to_back(key)
    return promoted

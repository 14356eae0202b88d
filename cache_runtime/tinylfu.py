"""W-TinyLFU for the pool (`cache_runtime.pool`): a frequency filter in front of a segmented LRU.

In the pool because libCacheSim's W-TinyLFU led every candidate the pool had at cs 20% and ps 5%
of the shipped LIRS traces (`preheat bench cache`, 2026-12-06). Apart from `queue_policies`
because it decides differently: the others queue keys and move them between queues on a hit;
this one also decides whether a new key gets in at all, by counts that outlive eviction. It
keeps the `EvictionPolicy` contract as they do.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy_extensions import mypyc_attr

from cache_runtime.key_queue import KeyQueue
from cache_runtime.policies import EvictionPolicy, Key, keep_nothing, queue_victim


@mypyc_attr(allow_interpreted_subclasses=True)
class WTinyLFUPolicy(EvictionPolicy):
    """W-TinyLFU (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache Admission
    Policy", ACM ToS 2017; Caffeine's layout): new keys enter a window LRU of 1%; the key the
    window lets go is admitted to the main part (a segmented LRU: probation 20%, protected 80%)
    only if it was requested more often than the key main would evict in its place, else it
    leaves. Frequencies count every request, misses included, so they outlive eviction (a
    returning key is known), and are halved every 10 x the cache's size requests, as Caffeine's
    sketch is, so the past fades.

    Counts are exact (a dict, capped at 15 like the sketch's 4-bit counters) rather than a
    count-min sketch: the sketch exists to save memory in a cache of millions of entries, and
    its collisions only add admission errors. The counts hold keys that are not cached too (a
    1,000-entry cache of a trace with 70% one-off keys counted 8,970), bounded by the halving,
    which drops the keys counted once: at most 15 x the cache's size (10 x of requests between
    halvings, half of that kept). Against libCacheSim's WTinyLFU (same capacities, no hints),
    over the 44 cells of `benchmarks/robustness.py` (2026-12-06): within 0.015 below it or
    above it everywhere (cs 10%: 0.0796 against 0.0880; Mooncake 5%: 0.1304 against 0.0795),
    and it hits where libCacheSim's does not below about 100 entries (a window of 1%
    rounds to none there; this one keeps at least one entry)."""

    name = "wtinylfu"

    def __init__(self, window_share: float = 0.01, protected_share: float = 0.8) -> None:
        self.window_share, self.protected_share = window_share, protected_share
        self._window = KeyQueue()  # LRU first
        self._probation = KeyQueue()  # LRU first
        self._protected = KeyQueue()  # LRU first
        self._counts: dict[Key, int] = {}  # requests per key, resident or not (see the doc)
        self._ticks = 0  # requests counted since the last halving
        self._capacity = 0  # entries, learned at the first eviction (as S3-FIFO's)
        self._window_size = self._main_size = self._protected_size = 0

    def _count(self, key: Key) -> None:
        counts = self._counts
        seen = counts.get(key, 0)
        if seen < 15:
            counts[key] = seen + 1
        self._ticks += 1
        if self._capacity and self._ticks >= 10 * self._capacity:
            self._ticks = 0
            self._counts = {k: n >> 1 for k, n in counts.items() if n > 1}

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._count(key)
        self._window.add(key)

    def on_access(self, key: Key, now: float) -> None:
        self._count(key)
        if key in self._window:
            self._window.move_to_back(key)
        elif self._probation.discard(key):
            self._protected.add(key)
            if self._capacity:
                self._rebalance()
        else:
            self._protected.move_to_back(key)

    def on_remove(self, key: Key) -> None:
        for queue in (self._window, self._probation, self._protected):
            if queue.discard(key):
                return

    def _learn_capacity(self) -> None:
        self._size_for(len(self._window) + len(self._probation) + len(self._protected))

    def resize(self, entries: int) -> None:
        """The window and the segments for `entries`; protected's overflow goes back to
        probation at once (a larger window drains through the contest, a victim at a time)."""
        if self._capacity:
            self._size_for(entries)
            self._rebalance()

    def _rebalance(self) -> None:
        """Protected's overflow back to probation, its LRU end first (as SLRU's)."""
        protected, probation = self._protected, self._probation
        while len(protected) > self._protected_size:
            probation.add(protected.pop_front())

    def _size_for(self, entries: int) -> None:
        self._capacity = entries
        self._window_size = max(1, int(self._capacity * self.window_share))
        self._main_size = max(1, self._capacity - self._window_size)
        self._protected_size = max(1, int(self._main_size * self.protected_share))

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        if not self._capacity:
            self._learn_capacity()
        window, probation, protected = self._window, self._probation, self._protected
        # until the main part is full, what the window lets go moves there without a contest
        # (a key the cache keeps too: moving it is not letting it go)
        while len(window) > self._window_size and len(probation) + len(protected) < self._main_size:
            probation.add(window.pop_front())
        if keep is not keep_nothing:
            self._admit_kept(keep)
        if len(window) >= self._window_size:
            candidate = queue_victim(window, keep)
            if candidate is not None:
                rival = queue_victim(probation, keep)
                if rival is None:
                    rival = queue_victim(protected, keep)
                if rival is None:
                    return candidate
                if self._counts.get(candidate, 0) > self._counts.get(rival, 0):  # admitted
                    window.remove(candidate)
                    probation.add(candidate)
                    return rival
                return candidate
        for queue in (probation, window, protected):
            found = queue_victim(queue, keep)
            if found is not None:
                return found
        return None

    def _admit_kept(self, keep: Callable[[Key], bool]) -> None:
        """Keys the cache keeps (the memory tier's pinned keys and KV pages with cached
        children) at the window's LRU end cannot be the one that leaves a contest, so they
        move on to main's probation, as an admitted key does, and the window keeps its share.
        Under prefix closure a page is a parent as soon as the next page of its prompt is
        written: left in the window they piled up, and every victim passed them all (Mooncake's
        pages through the tier at 10%: 11,606 `keep` calls per victim, 377 s, hit ratio 0.1956;
        now 71 calls, 0.2428; the other candidates hit 0.25-0.28 there). Also tried: the kept
        keys a victim passes sent to their queue's back, as S3-FIFO did until 2026-12-06: 47
        calls, but 0.2352."""
        window, probation = self._window, self._probation
        while len(window) > self._window_size:
            head = window.front()
            if not keep(head):
                return
            window.remove(head)
            probation.add(head)

    def ranked(self) -> list[Key]:
        return [*self._probation, *self._window, *self._protected]

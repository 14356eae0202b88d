"""The pool's simulated caches (`pool.PoolPolicy`): a shadow, one candidate replaying the
sampled keys, and the rebuild of a new leader, a full-size shadow replaying the cache's history a
slice per eviction. Apart from the selector, so that each module stays small; compiled with it
(`compiled.MODULES`).
"""

from __future__ import annotations

import copy
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat

from cache_runtime.policies import EvictionPolicy, Key

# history accesses a rebuild replays per eviction, on top of the accesses since the previous
# one (so it always gains): a switch completes within `pool.MAX_HISTORY` / REBUILD_STEP evictions,
# and no `victim` call replays more than this plus the hits before it
REBUILD_STEP = 1024

SPOT_BITS = 24
_MASK64 = (1 << 64) - 1


def spot(key: object) -> int:
    """Where a key falls in [0, 2**24), the same in every process. Ints are mixed by a
    Fibonacci multiply (block numbers are often strided: `key % n` would sample one stride);
    strings by CRC-32. Rejected: Python's `hash`, salted per process for strings — replays of
    one trace then differed by ~2% of hits from run to run."""
    if isinstance(key, int):
        return ((key * 0x9E3779B97F4A7C15) & _MASK64) >> (64 - SPOT_BITS)
    return zlib.crc32(str(key).encode()) >> (32 - SPOT_BITS)


class Shadow:
    """A small simulated cache of one candidate over the sampled keys."""

    __slots__ = ("capacity", "gone", "hinted", "policy", "resident")

    def __init__(self, policy: EvictionPolicy, capacity: int, hinted: bool) -> None:
        self.policy = policy
        self.capacity = max(1, capacity)
        self.resident: set[object] = set()
        self.hinted = hinted
        self.gone: Key | None = None  # what the last miss evicted (None: nothing)

    def access(self, key: Key, hint: str | None) -> bool:
        if key in self.resident:
            self.policy.on_access(key, 0.0)
            return True
        gone = None
        if len(self.resident) >= self.capacity:
            gone = self.policy.evict()  # never None: nothing is kept
            if gone is not None:
                self.resident.discard(gone)
        self.gone = gone
        self.policy.on_insert(key, 0.0, hint if self.hinted else None)
        self.resident.add(key)
        return False

    def cool(self, key: Key) -> None:
        if self.hinted and key in self.resident:
            self.policy.on_cold(key)

    def replica(self, hinted: bool) -> Shadow:
        """An exact copy of this shadow, given the hints from now on or not."""
        twin = Shadow(copy.deepcopy(self.policy), self.capacity, hinted)
        twin.resident = set(self.resident)
        return twin


class Rebuild:
    """A new leader's state in the making: a full-size, hint-free simulated cache replaying the
    history, then the accesses that arrive while it replays (see `pool`'s docstring).

    Given the cache's own hits over the same accesses (`cached`, True for a hit), it also
    checks the switch on the whole key space before it is made: the shadows chose the new
    leader on a sample of the keys, whose luck can rank two policies the other way round. Over
    the second half of the history and all that is fed after (the first half warms the new
    leader), `gained` counts the accesses only it hits and `lost` those only the cache hit
    (`gains_on_cache`). Rejected: a full-size replay of the leader's own policy beside it as
    the rival (a like-for-like cold start: one more cell within tolerance, Mooncake 5%, but the
    replay 20-30% slower on Mooncake and sprite in alternating runs, each switch replaying
    twice)."""

    __slots__ = ("cached", "fresh", "gained", "lost", "make", "pending", "shadow", "unscored")

    def __init__(
        self,
        make: Callable[[], EvictionPolicy],
        capacity: int,
        history: deque[Key],
        cached: deque[bool] | None = None,
    ) -> None:
        self.make = make  # the candidate's
        self.shadow = Shadow(make(), capacity, False)
        self.pending = deque(history)
        self.cached = None if cached is None else deque(cached)  # parallel to `pending`
        self.fresh = 0  # accesses fed since the last `advance`
        self.unscored = len(history) // 2  # accesses left before the counts start
        self.gained = self.lost = 0

    def feed(self, key: Key, hit: bool) -> None:
        self.pending.append(key)
        if self.cached is not None:
            self.cached.append(hit)
        self.fresh += 1

    def feed_many(self, keys: Sequence[Key]) -> None:
        """Hits of the cache, in bulk."""
        self.pending.extend(keys)
        if self.cached is not None:
            self.cached.extend(repeat(True, len(keys)))
        self.fresh += len(keys)

    def advance(self) -> bool:
        """Replay the next slice; True once nothing is left to replay."""
        access, take, cached = self.shadow.access, self.pending.popleft, self.cached
        for _ in range(min(len(self.pending), REBUILD_STEP + self.fresh)):
            hit = access(take(), None)
            if cached is None:
                continue
            was = cached.popleft()
            if self.unscored > 0:
                self.unscored -= 1
            elif hit != was:
                if hit:
                    self.gained += 1
                else:
                    self.lost += 1
        self.fresh = 0
        return not self.pending

    @property
    def judged(self) -> bool:
        """Whether it counts against the cache's hits (a rebuild begun for a hinted candidate
        does not: it replays no hints, so it cannot show what they are worth)."""
        return self.cached is not None

    def gains_on_cache(self, z: float) -> bool:
        """It hit more than the cache over the scored accesses, by more than `z` standard
        deviations: McNemar's test on the accesses where the two differ, one-sided."""
        return self.gained - self.lost > z * (self.lost + self.gained) ** 0.5

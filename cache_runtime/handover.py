"""A new leader taking over a cache it did not fill (`pool.PoolPolicy`'s switch).

The cache holds what the old leader chose. The new leader arrives with the state its rebuild gave
it, which covers the resident keys it would itself have kept; the others it has never seen. They
stay with the old leader, which evicts them first, in its own order and with its own knowledge
of them, until none is left; a hit on one hands it to the new leader as a key inserted before
and read now. The switch itself costs one pass over what the new leader knows (and a set
difference over the cache); the keys both know leave the old leader when it names them
(`victim`, `DROP_STEP` at most per call) or when they leave the cache.

Measured against the previous switch (2026-12-05), which inserted each unknown key into the new
leader and marked it cold:
- hits, the 44 cells of `benchmarks/robustness.py`: summed margin to the best libCacheSim
  policy -0.061 -> -0.035, cells short 17 -> 16, worst ratio unchanged (0.879, cs 5%); the 40
  cells at sizes it does not measure (2, 3, 7, 15%) +0.014 summed; no cell down by more than
  0.002. `on_cold` put each inserted key in front of the previous one, so the keys the old
  leader protected most went first; that order reversed gave only +0.005 of the +0.026: the
  rest is the old leader's knowledge of its own keys. A hit handed over as a plain insert, not
  insert-and-read: -0.001.
- the switch's one-time cost under the memory tier's lock, 100,000 entries (a generated Zipf
  trace, 65,536 accesses of history covering 28,000 of them, garbage collection off while
  timed): 67-89 ms -> 11-23 ms; 10,000 entries 5-9 ms -> 2-4 ms. Removing the keys both know
  from the old leader at once instead of when it names them: 34-46 ms, the same hits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from cache_runtime.policies import EvictionPolicy, Key, keep_nothing

# keys both leaders know that one `victim` call lets go from the old leader at most. The memory
# tier may ask for several victims before it removes any: a call that finds every legacy key
# chosen or protected would otherwise walk all the shared keys at once (a two-victim put as the
# last legacy key goes, 100,000 entries, 2026-12-05: 40.9 ms; with this bound 0.18 ms, the same
# hits over the 84 cells of the sweep); past it, the new leader names the victim. Where the cache
# protects keys it is also how many keys the old leader may ask `keep` about per call
DROP_STEP = 256


@mypyc_attr(allow_interpreted_subclasses=True)
class Handover(EvictionPolicy):
    """`leader` decides; `old` evicts the resident keys in `legacy` first. `old` may still
    hold resident keys the leader holds too (let go as it names them, `DROP_STEP` at most per
    call) and may itself be a Handover (a switch before the previous one drained)."""

    name = "handover"

    def __init__(self, leader: EvictionPolicy, old: EvictionPolicy, legacy: set[Key]) -> None:
        self.leader, self.old, self.legacy = leader, old, legacy

    def _drop_old(self, key: Key) -> bool:
        """`key` leaves the old leader (a no-op where it is not there: the old leader must
        never hold a key the cache no longer has, the tier's `keep` reads every key it is
        asked about); whether it was a legacy key."""
        self.old.on_remove(key)
        if key in self.legacy:
            self.legacy.discard(key)
            return True
        return False

    def _adopt(self, key: Key, now: float) -> None:
        """A legacy key hit: the new leader takes it as inserted before and read now."""
        self._drop_old(key)
        self.leader.on_insert(key, now, None)
        self.leader.on_access(key, now)

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self.leader.on_insert(key, now, hint)

    def on_access(self, key: Key, now: float) -> None:
        if key in self.legacy:
            self._adopt(key, now)
        else:
            self.leader.on_access(key, now)

    def on_access_many(self, keys: Sequence[Key]) -> None:
        legacy = self.legacy
        if legacy.isdisjoint(keys):
            self.leader.on_access_many(keys)
            return
        run: list[Key] = []  # the leader's keys since the last legacy one, in order
        for key in keys:
            if key in legacy:
                self.leader.on_access_many(run)
                run = []
                self._adopt(key, 0.0)
            else:
                run.append(key)
        self.leader.on_access_many(run)

    def on_remove(self, key: Key) -> None:
        if not self._drop_old(key):
            self.leader.on_remove(key)

    def on_lost(self, key: Key) -> None:
        self.leader.on_lost(key)

    def on_cold(self, key: Key) -> None:
        if key not in self.legacy:  # a legacy key goes first already; the old leader gets no hints
            self.leader.on_cold(key)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        if self.legacy:
            old = self.old
            # where the cache protects keys, the old leader may look at DROP_STEP of them per
            # eviction; past that (or naming none) it retires (`_retire_old`)
            asked = keep if keep is keep_nothing else _Budget(keep, DROP_STEP)
            for _ in range(DROP_STEP):
                key = old.victim(asked)
                if key is not None and key in self.legacy:
                    return key
                if key is None or (isinstance(asked, _Budget) and asked.left < 0):
                    self._retire_old()
                    break
                old.on_remove(key)  # a key the new leader holds too: the old one lets it go
        return self.leader.victim(keep)

    def _retire_old(self) -> None:
        """The old leader found no legacy key it may let go within its budget: in the memory
        tier, where KV pages with cached children are kept, its keys left are mostly parents,
        and each eviction passed them all (Mooncake's pages at 20%, interpreted: 21 s for the
        trace, 4 x any candidate alone; the old S3-FIFO asked `keep` 6,668 times per call). The
        new leader takes them as the switch before the handover did: inserted in the old
        leader's order, then marked cold from its last victim to its first, so that its first
        go first whether the leader queues them by insertion (S3-FIFO, MQ) or cools them to its
        eviction end (LRU, SLRU, ARC, LIRS). In a trace's replay nothing is protected and the
        old leader always names a key: the same hits in all 88 figures of the session's sweep
        (2026-12-06)."""
        legacy, leader = self.legacy, self.leader
        order = [key for key in self.old.ranked() if key in legacy]
        for key in order:
            leader.on_insert(key, 0.0, None)
        for key in reversed(order):
            leader.on_cold(key)
        legacy.clear()

    def ranked(self) -> list[Key]:
        legacy = self.legacy
        return [key for key in self.old.ranked() if key in legacy] + self.leader.ranked()


class _Budget:
    """`keep` for the old leader, with a budget: once `left` keys have been asked about, every
    key reads as kept, so the old leader's search ends without naming a key it did not judge."""

    def __init__(self, keep: Callable[[Key], bool], left: int) -> None:
        self.keep, self.left = keep, left

    def __call__(self, key: Key) -> bool:
        self.left -= 1
        return self.left < 0 or self.keep(key)

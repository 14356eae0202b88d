"""A new leader taking over a cache it did not fill (`pool.PoolPolicy`'s switch).

The cache holds what the old leader chose. The new leader arrives with the state its rebuild gave
it, which covers the resident keys it would itself have kept; the others it has never seen. They
stay with the old leader, which evicts them first, in its own order and with its own knowledge
of them, until none is left; a hit on one hands it to the new leader as a key inserted before
and read now. The switch itself costs one pass over what the new leader knows, not over the
cache; the keys both know leave the old leader only when it names them (`victim`).

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
  timed): 67-89 ms -> 11-21 ms; 10,000 entries 5-9 ms -> 3-4 ms. Removing the keys both know
  from the old leader at once instead of when it names them: 34-46 ms, the same hits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from cache_runtime.policies import EvictionPolicy, Key


@mypyc_attr(allow_interpreted_subclasses=True)
class Handover(EvictionPolicy):
    """`leader` decides; `old` evicts the resident keys in `legacy` first. `old` may still
    hold keys the leader holds too (dropped as it names them) and may itself be a Handover (a
    switch before the previous one drained)."""

    name = "handover"

    def __init__(self, leader: EvictionPolicy, old: EvictionPolicy, legacy: set[Key]) -> None:
        self.leader, self.old, self.legacy = leader, old, legacy

    def _adopt(self, key: Key, now: float) -> None:
        """A legacy key hit: the new leader takes it as inserted before and reused now."""
        self.legacy.discard(key)
        self.old.on_remove(key)
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
        if key in self.legacy:
            self.legacy.discard(key)
            self.old.on_remove(key)
        else:
            self.leader.on_remove(key)

    def on_lost(self, key: Key) -> None:
        self.leader.on_lost(key)

    def on_cold(self, key: Key) -> None:
        (self.old if key in self.legacy else self.leader).on_cold(key)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        legacy, old = self.legacy, self.old
        while legacy:
            key = old.victim(keep)
            if key is None:
                break
            if key in legacy:
                return key
            old.on_remove(key)  # the new leader holds it: drop it from the old one, now
        return self.leader.victim(keep)

    def ranked(self) -> list[Key]:
        legacy = self.legacy
        return [key for key in self.old.ranked() if key in legacy] + self.leader.ranked()

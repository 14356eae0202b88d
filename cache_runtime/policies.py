"""Eviction policies: small objects that only order candidates; the tier does the evicting.

As in cachetools and LMCache, a policy never touches the stored data and never decides about
pinned entries: the tier asks `victim(keep)` for the first candidate in eviction order that it
may evict (`keep(key)` is True for pinned entries and for KV pages that still have children),
then removes it. The trace simulator (`preheat bench cache`) is to replay traces through these
same objects, so that what is measured is what is served.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from cache_runtime.key_queue import KeyQueue

# A cache key: the tier's strings, a trace's integers. These modules are compiled by mypyc when
# a C compiler is at hand (`make`; see `cache_runtime.compiled`), and mypyc checks declared
# types at run time: `str` here would refuse a trace's integer keys.
Key = Hashable


def keep_nothing(_: Key) -> bool:
    """The `keep` of a simulated cache (the pool's shadows, a trace's replay), which protects no
    key: the victims below do not call it. Every miss of every shadow asks for a victim, about 7
    calls per access on cs where every key is sampled; skipping them took the pool's replay of
    cs from 207,735 to 222,608 accesses/s (best of 3, the same hits in all 84 cells of the sweep,
    2026-12-06)."""
    return False


def queue_victim(queue: KeyQueue, keep: Callable[[Key], bool]) -> Key | None:
    """The first key of a policy's queue that `keep` lets go (None if it keeps them all):
    where nothing is kept (a shadow, a replay), the front, with no call of `keep`."""
    if keep is keep_nothing:
        return queue.first()
    return queue.first_evictable(keep)


@mypyc_attr(allow_interpreted_subclasses=True)
class EvictionPolicy:
    """Base: `on_insert` / `on_access` / `on_remove` keep state, `victim` names the next one."""

    name = "base"
    uses_time = False  # True if on_access/on_insert read `now` (else the tier passes 0.0)

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        """`hint` is what the application knows about the new entry (see `Hint`)."""
        raise NotImplementedError

    def on_access(self, key: Key, now: float) -> None:
        raise NotImplementedError

    def on_access_many(self, keys: Sequence[Key]) -> None:
        """Hits in access order, repeats included: what the memory tier's read buffer holds
        when it catches the policy up. Must leave the policy exactly as `on_access(key, 0.0)`
        per key would (the tests compare the two); policies override it with bulk C-level
        operations, which is what makes a buffered hit cheap. An override must skip keys that
        are no longer cached (a concurrent delete can remove a key after a reader buffered it);
        this default is given only cached keys."""
        for key in keys:  # the memory tier gives this default only keys still cached
            self.on_access(key, 0.0)

    def on_remove(self, key: Key) -> None:
        raise NotImplementedError

    def on_lost(self, key: Key) -> None:
        """`key` is gone from the cache though this policy did not evict it, and it may come
        back: remember it as an evicted key (a ghost), so that its return counts as a reuse.
        What a switch of policy (`PoolPolicy`) calls for each key the new leader would hold
        and the cache no longer does. The default is `on_remove`, which already keeps a ghost
        in the policies that have one. S3-FIFO forgets a key of its main queue there and
        overrides this. (LIRS forgets a LIR key too; a ghost of it changed 3 of the 44 cells
        of `benchmarks/robustness.py` by 0.0002, so it keeps the default.)"""
        self.on_remove(key)

    def on_cold(self, key: Key) -> None:
        """The application says `key` will not be needed soon (its conversation ended): make it
        the next to go. The default does nothing, which is always safe."""

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        """The entry to evict next, skipping those `keep` protects; None if all are protected."""
        raise NotImplementedError

    def resize(self, entries: int) -> None:
        """The cache now holds about `entries` when it evicts, far from the size this policy
        last took (learned at its first eviction, or told here before): the memory tier, whose
        budget is in bytes, calls it where its values changed size (`memory.RESIZE_AT`). The
        policies with sizes in entries take it in place (LIRS's LIR set, S3-FIFO's small queue,
        MQ's lifetime, ARC's target, SLRU's and W-TinyLFU's segments, the pool's shadows). A
        policy whose size was not learned yet learns it at its next eviction; one with no sizes
        (LRU, LRU-K, heat) ignores it, as this default does."""

    def evict(self) -> Key | None:
        """`victim(keep_nothing)`, then `on_remove` of it: what a simulated cache (the pool's
        shadows, `shadows.Shadow`) does on every miss once full. The policies whose victim and
        removal look up the same queue do both at once (LRU, SLRU, ARC, MQ, LIRS; the tests
        hold each to the two calls). The pool's replay of cs, where every key is sampled and
        most accesses miss, went from about 213,000 to 223,000 accesses/s (best of 3, runs
        alternated; the same hits in all 84 cells of the sweep, 2026-12-06)."""
        key = self.victim(keep_nothing)
        if key is not None:
            self.on_remove(key)
        return key

    def ranked(self) -> list[Key]:
        """Every cached key, about in the order this policy would evict them: the order in
        which a switch of policy (`PoolPolicy`) gives the new leader its ghosts, the same in
        every process. Only the pool's candidates need it."""
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class LRUPolicy(EvictionPolicy):
    """Least recently used first. On LLM prefix traces it beats LRU-2 (0.278 vs 0.195 hit ratio
    at 10% of unique blocks, issue 3)."""

    name = "lru"

    def __init__(self) -> None:
        self._order = KeyQueue()

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._order.push_back(key)

    def on_access(self, key: Key, now: float) -> None:
        self._order.move_to_back(key)

    def on_access_many(self, keys: Sequence[Key]) -> None:
        self._order.move_all_to_back(keys)

    def on_remove(self, key: Key) -> None:
        self._order.discard(key)

    def on_cold(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_front(key)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        return queue_victim(self._order, keep)

    def evict(self) -> Key | None:
        return self._order.pop_front() if self._order else None

    def ranked(self) -> list[Key]:
        return list(self._order)


@mypyc_attr(allow_interpreted_subclasses=True)
class LRUKPolicy(EvictionPolicy):
    """LRU-K (O'Neil et al., 1993) for K=2 by default: evict the entry whose K-th most recent
    access is oldest; entries seen fewer than K times go first, least recently used first.

    The "seen twice" entries sit in a heap keyed by their K-th most recent access, with stale
    heap entries skipped lazily, so an eviction costs O(log n) rather than a sort.
    """

    name = "lru-k"
    uses_time = True

    def __init__(self, k: int = 2) -> None:
        if k < 2:
            raise ValueError("k must be >= 2 (k=1 is LRU)")
        self.k = k
        self._history: dict[Key, list[float]] = {}
        self._young = KeyQueue()  # seen < k times
        self._heap: list[tuple[float, int, Key]] = []  # (k-th last access, tiebreak, key)
        self._ticks: dict[Key, int] = {}  # seen >= k times -> tiebreak of its live heap entry
        self._tick = 0

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._history[key] = [now]
        self._young.add(key)

    def on_access(self, key: Key, now: float) -> None:
        history = self._history[key]
        history.append(now)
        del history[: -self.k]
        if len(history) < self.k:
            self._young.move_to_back(key)
            return
        self._young.discard(key)
        self._tick += 1
        self._ticks[key] = self._tick
        heapq.heappush(self._heap, (history[0], self._tick, key))
        if len(self._heap) > 2 * len(self._ticks) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the stale heap entries: every hit pushes one and only `victim` pops them, so a
        tier that is not full would grow the heap without bound. The live entries are rebuilt
        with their own ticks, so the order (and every later victim) is unchanged."""
        self._heap = [(self._history[k][0], t, k) for k, t in self._ticks.items()]
        heapq.heapify(self._heap)

    def on_remove(self, key: Key) -> None:
        self._history.pop(key, None)
        self._young.discard(key)
        self._ticks.pop(key, None)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        young = queue_victim(self._young, keep)
        if young is not None:
            return young
        kept: list[tuple[float, int, Key]] = []
        found = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            kth, _, key = entry
            history = self._history.get(key)
            if history is None or len(history) < self.k or history[0] != kth:
                continue  # stale: removed, or accessed again since this entry was pushed
            if keep(key):
                kept.append(entry)
                continue
            found = key
            kept.append(entry)  # stays valid until the tier calls on_remove
            break
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return found


@mypyc_attr(allow_interpreted_subclasses=True)
class HeatPolicy(EvictionPolicy):
    """Evict the coldest entry by decayed access frequency (LRFU, Lee et al. 1999).

    Heat of a key: each access adds 1, and heat decays by half every `half_life` time units
    (`cache_runtime.heat.bump`). A short half-life makes it LRU, a long one LFU: the half-life is
    the knob the decay tuner (`preheat tune decay`) searches. Entries sit in a heap keyed by
    the time-invariant score log(heat) + lambda x last_access, with stale entries skipped
    lazily, so an access or an eviction costs O(log n).

    Priorities (optional): an access by a request of priority p (1..10) adds (p / 10) ** w
    instead of 1, w = `priority_weight` >= 0. w = 0 ignores priorities, w = 1 is the coupled
    heat's linear priority (`cache_runtime.heat.coupled_heat`), a larger w lets pages that
    high-priority requests reuse outlast a churn of low-priority one-offs; the tuner searches w
    with the half-life. The priority comes with each access (`on_insert_priority` /
    `on_access_priority`), not as a per-key attribute: a page shared by requests of several
    priorities earns heat from each at its own weight. Separate methods rather than an optional
    argument of `on_insert` / `on_access`: those stay exactly as they were (an access adds 1.0)
    and as fast, since the replay and the memory tier call them per access (an optional argument
    with its `is None` test cost a few percent there on the Mooncake trace).
    """

    name = "heat"
    uses_time = True

    def __init__(self, half_life: float = 3600.0, priority_weight: float = 1.0) -> None:
        if not half_life > 0:
            raise ValueError("half_life must be positive")
        if not (priority_weight >= 0 and math.isfinite(priority_weight)):
            raise ValueError("priority_weight must be a finite number >= 0")
        self.rate = math.log(2) / half_life
        self.priority_weight = float(priority_weight)
        # key -> (heat, last access, score, tiebreak of its live heap entry)
        self._state: dict[Key, tuple[float, float, float, int]] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._tick = 0

    def _set(self, key: Key, heat: float, now: float) -> None:
        score = math.log(heat) + self.rate * now
        self._tick += 1
        self._state[key] = (heat, now, score, self._tick)
        heapq.heappush(self._heap, (score, self._tick, key))
        if len(self._heap) > 2 * len(self._state) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop stale heap entries (they pile up on hits, see `LRUKPolicy._compact`); the live
        ones keep their ticks, so the order is unchanged."""
        self._heap = [(state[2], state[3], k) for k, state in self._state.items()]
        heapq.heapify(self._heap)

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._set(key, 1.0, now)

    def on_access(self, key: Key, now: float) -> None:
        heat, last, _, _ = self._state[key]
        self._set(key, heat * math.exp(-self.rate * max(0.0, now - last)) + 1.0, now)

    def on_insert_priority(self, key: Key, now: float, hint: str | None, priority: float) -> None:
        """`on_insert` for a request of priority `priority` (1..10): heat (p / 10) ** w."""
        self._set(key, (priority / 10) ** self.priority_weight, now)

    def on_access_priority(self, key: Key, now: float, priority: float) -> None:
        """`on_access` for a request of priority `priority` (1..10): adds (p / 10) ** w."""
        heat, last, _, _ = self._state[key]
        gain = (priority / 10) ** self.priority_weight
        self._set(key, heat * math.exp(-self.rate * max(0.0, now - last)) + gain, now)

    def on_remove(self, key: Key) -> None:
        self._state.pop(key, None)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        kept: list[tuple[float, int, Key]] = []
        found = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            state = self._state.get(entry[2])
            if state is None or state[2] != entry[0]:
                continue  # stale: removed, or accessed since
            kept.append(entry)
            if not keep(entry[2]):
                found = entry[2]
                break
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return found


class Hint:
    """Application knowledge passed with an insert.

    TAIL: the last block of a request's prompt (known when the request arrives: its length is
    known), which is rarely shared by a later prompt — on real conversation traces a request's
    last block is almost never reused.
    CONVERSATION: the block belongs to a conversation that has already had a follow-up turn
    (the application's session id and turn number say so) and has not ended: its next turn
    reads the whole history again. The prefix policies insert such blocks on their "reused"
    side (ARC's T2, SLRU's protected segment) instead of making them earn it with a second hit.
    The other hints have their own calls: "conversation ended" is
    `HybridCache.end_session(tenant, session)` (cools the entries only that session read, as
    recorded by `kv_pages` calls given its id) or `cool(keys)` for keys the caller chose; "pin
    with TTL" is `put(pinned=True, ttl_s=...)`."""

    TAIL: Final = "tail"
    CONVERSATION: Final = "conversation"


def _registry() -> dict[str, type[EvictionPolicy]]:
    from cache_runtime.pool import PoolPolicy
    from cache_runtime.prefix_policies import PrefixARC, PrefixSLRU
    from cache_runtime.queue_policies import LIRSPolicy, MQPolicy, S3FIFOPolicy

    return {
        "lru": LRUPolicy,
        "lru-k": LRUKPolicy,
        "heat": HeatPolicy,
        "prefix-slru": PrefixSLRU,
        "prefix-arc": PrefixARC,
        "mq": MQPolicy,
        "s3fifo": S3FIFOPolicy,
        "lirs": LIRSPolicy,
        "preheat": PoolPolicy,
    }


def make_policy(name: str) -> EvictionPolicy:
    """A new policy by name; `ValueError` naming the choices for an unknown one."""
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(registry)}")
    return registry[name]()


POLICY_NAMES = (
    "lru", "lru-k", "heat", "prefix-slru", "prefix-arc", "mq", "s3fifo", "lirs", "preheat",
)  # fmt: skip
# The memory tier's default follows the best of a pool by miniature simulation
# (`cache_runtime.pool`): no single policy leads on every shipped trace and size.
DEFAULT_POLICY = "preheat"

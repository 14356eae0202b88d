"""The memory tier: a byte budget, a pluggable eviction policy, TTLs, pinning, prefix closure.

Budget in bytes, not items: KV pages of one model are ~100 KiB each and responses ~1 KiB, so an
item count says nothing about memory. Eviction asks the policy for victims until the new value
fits, skipping pinned entries and KV pages that still have cached children (prefix closure: a
page is only useful when every page before it is cached, so a parent never goes before its
children). A value that cannot fit, because it exceeds the budget or everything else is
protected, is refused rather than stored over budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cache_runtime.policies import DEFAULT_POLICY, EvictionPolicy, make_policy
from cache_runtime.tiers.base import EvictionCallback, TierStats

_READ_BUFFER = 65536  # buffered hits before a reader drains them into the policy (see `get`)


@dataclass(slots=True)
class _Entry:
    value: bytes
    expires_at: float | None
    pinned: bool
    parent: str | None
    written_ns: int  # time.monotonic_ns() of the write: lets the hybrid cache drop a demotion
    # of a value that an invalidation has superseded meanwhile
    # the pages cached under this one, in the order they were written: a dict, not a set, so
    # that a subtree is removed in the same order in every process (a set of strings iterates
    # in hash-seed order, and the order of removals decides ARC's and SLRU's ghosts)
    children: dict[str, None] = field(default_factory=dict)


# The policies learn their sizes in entries at the first eviction (LIRS's LIR set, S3-FIFO's small
# queue, MQ's lifetime, ARC's target, SLRU's and W-TinyLFU's segments; the pool its shadows), as
# libCacheSim's do; in a byte budget the entries move where values differ in size (a node cache
# holds KV pages, embeddings and answers: filled first by warm-up's pages, it holds many times as
# many entries once traffic's answers come). Where the entries at evictions, smoothed over about
# one turnover of the cache, are this many times those the policy was sized for, or this share of
# them, the tier tells the policy (`EvictionPolicy.resize`). Never told, after three 4 KB values in
# 10,000 bytes, each policy hit 0.005-0.07 less on a Zipf workload of 10-byte keys than with no
# large values first (told: within 0.007), and on a loop of 1,300 such keys LIRS and S3-FIFO hit
# nothing (told: 0.37 and 0.54, against 0.73 and 0.47 with no large values first; LIRS keeps a 4 KB
# value in its LIR set, counting entries, not bytes). Smoothed, not the entries at one eviction:
# where the mix of sizes does not change (5% of the keys 10 KB, the rest 100 B, in 100 KB) the
# entries at an eviction swing with how many large values are resident, and the tier told the
# policies 118-668 times per 60,000 evictions (LIRS 0.006-0.022 below never told, the pool 0.037);
# smoothed, 1-12 times, every policy alone within 0.0001 of never told or above it by up to 0.019,
# and the pool, over twelve such runs, 0.4153 against 0.4132 never told (review, 2026-12-07). A
# quarter, not a half: on the loop the pool's shadows built for 601 entries where the cache held
# 1,000 ranked the candidates for another cache (a loop 2.2 x it).
RESIZE_AT = 1.25


class MemoryTier:
    """An in-process tier; thread-safe (one lock: entries are small and operations O(1))."""

    def __init__(
        self,
        capacity_bytes: int,
        policy: EvictionPolicy | str = DEFAULT_POLICY,
        clock: Callable[[], float] = time.monotonic,
        name: str = "memory",
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._on_access = self.policy.on_access
        self._timed = self.policy.uses_time
        # A policy without its own bulk update gets only keys still cached (its `on_access`
        # may not know to skip a key that a concurrent delete removed after it was read)
        self._filter_reads = type(self.policy).on_access_many is EvictionPolicy.on_access_many
        if self._timed:  # a time-aware policy needs each hit's time: no read buffer
            self.get = self._get_locked  # type: ignore[method-assign]
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0
        self._sized_for = 0  # entries the policy was sized for: the first eviction's, or told
        self._typical = 0.0  # entries at an eviction, smoothed (`_track_size`)
        self._lock = threading.Lock()
        self._stats = TierStats(capacity_bytes=capacity_bytes)
        self.on_evict: EvictionCallback | None = None
        self._evicted: list[tuple[str, bytes, float | None, int | None]] = []
        self._reads: list[str] = []  # hits not yet shown to the policy (see `get`)
        self._buffered_writes = 0  # overwrites among them (`_overwrite`)

    # -- protocol ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """Lock-free on the hit path: the hit is recorded in a read buffer that the policy
        catches up with before its next decision (as Caffeine does), so readers never wait for
        each other or for the policy. Every put drains the buffer before it evicts, and the
        policy applies a drained batch exactly as it would have applied each hit
        (`EvictionPolicy.on_access_many`), so eviction decisions are the same as with eager
        updates — only cheaper: a batch is deduplicated and applied with C-level operations.
        One race is accepted: a reader that found an entry just before another thread deleted
        and re-inserted its key buffers the hit after the re-insert, so it counts for the new
        entry (single-threaded this cannot happen: every insert and removal drains first).
        """
        entry = self._entries.get(key)  # one dict read: atomic under the GIL
        if entry is None or entry.expires_at is not None:
            return self._get_locked(key)
        reads = self._reads
        reads.append(key)  # list.append is atomic: no lost reads between threads
        if len(reads) >= _READ_BUFFER and self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()
        return entry.value

    def _get_locked(self, key: str) -> bytes | None:
        """Misses, entries with a TTL and time-aware policies: the plain locked path."""
        with self._lock:
            self._drain()
            entry = self._live(key)
            if entry is None:
                self._stats.misses += 1
                return None
            self._stats.hits += 1
            self._on_access(key, self._clock() if self._timed else 0.0)
            return entry.value

    def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl_s: float | None = None,
        pinned: bool = False,
        parent: str | None = None,
        hint: str | None = None,
    ) -> bool:
        """As the protocol; `hint` is passed to the policy (`policies.Hint`)."""
        with self._lock:
            entry = self._entries.get(key)
            if (  # the common rewrite of a cached value: inline, no policy work (`_overwrite`)
                entry is not None
                and ttl_s is None
                and parent is None
                and not self._timed
                and self._bytes + len(value) - len(entry.value) <= self.capacity_bytes
            ):
                self._stats.puts += 1
                self._bytes += len(value) - len(entry.value)
                entry.value, entry.expires_at, entry.pinned = value, None, pinned
                entry.written_ns = time.monotonic_ns()
                self._buffer_overwrite(key)
                return True
            stored = self._put_locked(key, value, ttl_s, pinned, parent, hint)
            evicted = self._evicted
            if evicted:
                self._evicted = []
        if evicted:
            self._demote(evicted)  # outside the lock: the next tier may be slow
        return stored

    def cool(self, keys: list[str]) -> int:
        """The application's "conversation ended": these entries go first when space is needed
        (unless pinned). Returns how many were cached."""
        with self._lock:
            self._drain()
            present = [k for k in keys if k in self._entries]
            for key in present:
                self.policy.on_cold(key)
            return len(present)

    def ttl_left(self, key: str) -> float | None:
        """Seconds until `key` expires; None when it never does; 0.0 when it is not cached."""
        with self._lock:
            entry = self._live(key)
            if entry is None:
                return 0.0
            return None if entry.expires_at is None else entry.expires_at - self._clock()

    def touch(self, key: str, ttl_s: float | None) -> bool:
        with self._lock:
            entry = self._live(key)
            if entry is None:
                return False
            entry.expires_at = None if ttl_s is None else self._clock() + ttl_s
            return True

    def delete(self, key: str) -> bool:
        with self._lock:
            if key not in self._entries:
                return False
            self._remove_with_descendants(key)
            return True

    def contains(self, key: str) -> bool:
        with self._lock:
            return self._live(key) is not None

    def stats(self) -> TierStats:
        with self._lock:
            self._drain()
            self._stats.items = len(self._entries)
            self._stats.bytes = self._bytes
            return TierStats(**vars(self._stats))

    def check(self) -> list[str]:
        with self._lock:
            problems = []
            actual = sum(len(e.value) for e in self._entries.values())
            if actual != self._bytes:
                problems.append(f"byte count {self._bytes} != stored {actual}")
            if self._bytes > self.capacity_bytes:
                problems.append(f"over budget: {self._bytes} > {self.capacity_bytes}")
            children: dict[str, set[str]] = {}
            for key, entry in self._entries.items():
                if entry.parent is not None:
                    if entry.parent not in self._entries:
                        problems.append(f"{key}: parent {entry.parent} not cached")
                    children.setdefault(entry.parent, set()).add(key)
            for key, entry in self._entries.items():
                if entry.children.keys() != children.get(key, set()):
                    problems.append(f"{key}: children {set(entry.children)} != {children.get(key)}")
            return problems

    def close(self) -> None:
        with self._lock:
            self._drain()
            for key in list(self._entries):
                self.policy.on_remove(key)
            self._entries.clear()
            self._bytes = 0

    # -- internals (lock held) ---------------------------------------------------------------

    def _put_locked(
        self,
        key: str,
        value: bytes,
        ttl_s: float | None,
        pinned: bool,
        parent: str | None,
        hint: str | None,
    ) -> bool:
        self._stats.puts += 1
        if parent is not None and self._live(parent) is None:
            return self._refuse(key)  # a page whose prefix is not cached is unusable
        # the clock is read only when something uses it (a TTL or a time-aware policy)
        now = self._clock() if ttl_s is not None or self._timed else 0.0
        expires = None if ttl_s is None else now + ttl_s
        previous = self._entries.get(key)
        if previous is not None:
            return self._overwrite(key, previous, value, expires, pinned, parent, now)
        if self._reads:
            self._drain()  # the insert must come after the hits before it
        if self._bytes + len(value) > self.capacity_bytes and not self._make_room(
            len(value), protect=(key, parent)
        ):
            self._stats.rejected += 1
            return False
        self._entries[key] = _Entry(value, expires, pinned, parent, time.monotonic_ns())
        if parent is not None:
            self._entries[parent].children[key] = None
        self.policy.on_insert(key, now, hint)
        self._bytes += len(value)
        return True

    def _overwrite(
        self,
        key: str,
        entry: _Entry,
        value: bytes,
        expires: float | None,
        pinned: bool,
        parent: str | None,
        now: float,
    ) -> bool:
        """A new value for a cached key: to the policy it is an access, so unless room must be
        made it joins the read buffer like a hit (no policy work now, same order as eagerly)."""
        needed = len(value) - len(entry.value)
        if self._bytes + needed > self.capacity_bytes:
            self._drain()
            if not self._make_room(needed, protect=(key, parent)):
                return self._refuse(key)
        entry.value, entry.expires_at, entry.pinned = value, expires, pinned
        entry.written_ns = time.monotonic_ns()
        self._bytes += needed
        if self._timed:
            self.policy.on_access(key, now)
        else:
            self._buffer_overwrite(key)
        return True

    def _refuse(self, key: str) -> bool:
        """A refused put. The key's older value, if cached, goes too (with the pages after it,
        as on a delete): the caller wrote a newer one elsewhere, and this tier must not go on
        serving the old one. Not demoted: a newer value exists."""
        self._stats.rejected += 1
        if key in self._entries:
            self._remove_with_descendants(key)
        return False

    def _buffer_overwrite(self, key: str) -> None:
        self._reads.append(key)
        self._buffered_writes += 1  # not a hit: `_drain` counts these out of the hits
        if len(self._reads) >= _READ_BUFFER:
            self._drain()

    def _drain(self) -> None:
        """Show the policy the buffered hits, in order (lock held)."""
        reads = self._reads
        count = len(reads)
        if not count:
            return
        batch = reads[:count]
        del reads[:count]  # appends made meanwhile stay for the next drain
        self._stats.hits += count - self._buffered_writes
        self._buffered_writes = 0
        if self._filter_reads:
            batch = [key for key in batch if key in self._entries]
        self.policy.on_access_many(batch)  # skips keys another thread removed after reading

    def _demote(self, evicted: list[tuple[str, bytes, float | None, int | None]]) -> None:
        if self.on_evict is None:
            return
        for key, value, ttl_left, written_ns in evicted:
            self.on_evict(key, value, ttl_left, written_ns)

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at is not None and self._clock() >= entry.expires_at:
            self._stats.expirations += 1
            self._remove_with_descendants(key)
            return None
        return entry

    def _make_room(self, needed: int, protect: tuple[str | None, ...]) -> bool:
        """Evict until `needed` more bytes fit. `protect`: the key being written and its parent
        (a new page must not push out the page it extends)."""
        if needed > self.capacity_bytes:
            return False

        chosen: dict[str, None] = {}

        def keep(key: str) -> bool:
            entry = self._entries[key]
            if key in protect or key in chosen or entry.pinned:
                return True
            # a parent becomes evictable once all its children are chosen (they go first). The
            # policies ask this of every protected key they pass, and on a prefix trace most
            # cached pages are parents: the first child not chosen settles it, where a set
            # difference per call (before 2026-12-06) built a new set each time. A loop, not
            # any() over a generator: Mooncake's pages through the tier with the pool at 10%
            # took 31 s so, 105 s with any(), 57 s with the set difference
            for child in entry.children:  # noqa: SIM110
                if child not in chosen:
                    return True
            return False

        self._track_size()  # an eviction is due: both callers checked
        # Choose all victims first and evict only if they free enough: a refused put must not
        # have thrown out entries for nothing.
        freed = 0
        while self._bytes - freed + needed > self.capacity_bytes:
            victim = self.policy.victim(keep)
            if victim is None:
                return False
            chosen[victim] = None
            freed += len(self._entries[victim].value)
        for victim in chosen:
            entry = self._entries[victim]
            if self.on_evict is not None:
                ttl_left = None if entry.expires_at is None else entry.expires_at - self._clock()
                self._evicted.append((victim, entry.value, ttl_left, entry.written_ns))
            self._remove(victim)
            self._stats.evictions += 1
        return True

    def _track_size(self) -> None:
        """An eviction is due: the entries now go into their smoothed count, with a step of one
        over the entries the policy was sized for (about one turnover of the cache), and the
        policy is told where that count has moved by `RESIZE_AT`."""
        entries = len(self._entries)
        if not self._sized_for:
            self._sized_for, self._typical = entries, float(entries)  # the policy learns it now
            return
        self._typical += (entries - self._typical) / self._sized_for
        if not self._sized_for / RESIZE_AT < self._typical < self._sized_for * RESIZE_AT:
            self._sized_for = round(self._typical)
            self.policy.resize(self._sized_for)

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._bytes -= len(entry.value)
        self.policy.on_remove(key)
        if entry.parent is not None and entry.parent in self._entries:
            self._entries[entry.parent].children.pop(key, None)

    def _remove_with_descendants(self, key: str) -> None:
        """Deleting or expiring a page makes its descendants unusable: they go too.

        The buffered hits reach the policy first: where a removed key sits when it goes (ARC's
        T1 or T2, SLRU's probation or protected) decides its ghost, so a removal must see the
        hits before it, as every eviction does."""
        if self._reads:
            self._drain()
        order, stack = [], [key]
        while stack:  # depth-first over the subtree; cost is its size, not the tier's
            current = stack.pop()
            order.append(current)
            stack.extend(self._entries[current].children)
        for victim in reversed(order):  # leaves first, so each parent's child set stays exact
            self._remove(victim)

"""The fast replay's tiers: the SSD and Redis tiers' policies on dicts, no files, no sockets.

The memory tier needs no stand-in: `MemoryTier` is already in memory, and the fast replay runs
it as it is (its eviction policy, byte budget and prefix closure are the code that serves). The
hybrid cache's promotion and demotion are its own code too (`HybridCache`). What costs a replay
its time is the SSD tier's two SQLite stores (a few hundred requests a second on 2 cores:
`DESIGN.md`), so `SimSSDTier` keeps the same heat index in a dict and a heap:

- every get, hit or miss, bumps the key's decayed frequency (`cache_runtime.heat`); a key never
  seen becomes a ghost row (heat only), the coldest ghosts go beyond `GHOST_LIMIT`;
- a put is admitted only if it is hotter than the coldest unpinned entries it must displace,
  taken in the index's order (score, then row age: SQLite walks `heat_rank` by rowid within a
  score, and a new row's rowid is above every live one's), else refused, dropping any older
  copy; a new row starts at the caller's `heat` (a warm-up's manifest) or one request, an
  existing row keeps its heat;
- TTLs in the row: an expired entry misses, is dropped on the get that finds it (without a heat
  bump, as the real tier returns before it), and still counts in the budget until then.
The real tier's checksums, write ids and crash recovery guard the bytes on disk; here there is
no disk, so none of that has anything to do. `tests/unit/test_replay_sim_tiers.py` runs one
sequence of operations through both and compares every answer; `tests/integration/test_replay.py`
replays a trace through both kinds of node and checks the same tier serves every access.

`SimRedisTier` is an exact LRU over `capacity` entries, with TTLs: Redis's `allkeys-lru` samples
a few keys per eviction (approximated LRU) and sizes by its own memory accounting, so once it
evicts, the real shared tier agrees with it in hit ratio, not hit for hit; below its cap the two
agree hit for hit.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cache_runtime.heat import DEFAULT_HALF_LIFE_S, bump, decay_rate, score
from cache_runtime.tiers.base import EvictionCallback, TierStats
from cache_runtime.tiers.ssd_index import GHOST_LIMIT


@dataclass(slots=True)
class _Row:
    heat: float
    last: float
    score: float
    seq: int  # the row's age: SQLite's rowid order among equal scores
    size: int = 0
    present: bool = False
    pinned: bool = False
    expires: float | None = None


class SimSSDTier:
    """`SSDTier`'s admission, eviction, heat and TTL on a dict (see the module docstring)."""

    def __init__(
        self,
        capacity_bytes: int,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        clock: Callable[[], float] = lambda: 0.0,
        name: str = "ssd",
        ghost_limit: int = GHOST_LIMIT,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.name, self.capacity_bytes = name, capacity_bytes
        self._rate, self._clock, self._ghost_limit = decay_rate(half_life_s), clock, ghost_limit
        self._rows: dict[str, _Row] = {}
        self._data: dict[str, bytes] = {}
        self._used = 0
        self._ghosts = 0
        self._seq = itertools.count()
        self._ranked: list[tuple[float, int, str]] = []  # present rows by (score, seq), lazy
        self._cold_ghosts: list[tuple[float, int, str]] = []  # ghost rows by (score, seq), lazy
        self._stats = TierStats(capacity_bytes=capacity_bytes)
        self.on_evict: EvictionCallback | None = None

    # -- protocol ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        now = self._clock()
        row = self._rows.get(key)
        if row is not None and row.present and row.expires is not None and now >= row.expires:
            self._drop(key, row)
            self._stats.expirations += 1
            self._stats.misses += 1
            return None
        value = self._data.get(key) if row is not None and row.present else None
        self._bump(key, row, now)
        if value is None:
            self._stats.misses += 1
        else:
            self._stats.hits += 1
        return value

    def put(
        self, key: str, value: bytes, *, ttl_s: float | None = None, pinned: bool = False,
        parent: str | None = None, hint: str | None = None, heat: float | None = None,
    ) -> bool:  # fmt: skip
        self._stats.puts += 1
        size, row = len(value), self._rows.get(key)
        if size > self.capacity_bytes:
            self._stats.rejected += 1
            if row is not None and row.present:
                self._drop(key, row)
            return False
        now = self._clock()
        candidate_heat = max((row.heat if row else 0.0) or 1.0, heat or 0.0)
        candidate = score(candidate_heat, row.last if row else now, self._rate)
        freed = row.size if row is not None and row.present else 0
        victims = self._victims(size - freed, float("inf") if pinned else candidate, key)
        if victims is None:
            self._stats.rejected += 1
            if row is not None and row.present:
                self._drop(key, row)
            return False
        demotions = [self._evict(victim, now) for victim in victims]
        ranked = row is not None and row.present and not row.pinned  # already in `_ranked`
        if row is None:
            row = _Row(candidate_heat, now, candidate, next(self._seq))
            self._rows[key] = row
        elif not row.present:
            self._ghosts -= 1
        self._used += size - freed
        row.size, row.present, row.pinned = size, True, pinned
        row.expires = None if ttl_s is None else now + ttl_s
        self._data[key] = value
        if not pinned and not ranked:
            heapq.heappush(self._ranked, (row.score, row.seq, key))
        for demotion in demotions:
            if demotion is not None and self.on_evict is not None:
                self.on_evict(*demotion)
        return True

    def delete(self, key: str) -> bool:
        row = self._rows.get(key)
        if row is None or not row.present:
            return False
        self._drop(key, row)
        return True

    def touch(self, key: str, ttl_s: float | None) -> bool:
        row, now = self._rows.get(key), self._clock()
        if row is None or not row.present or (row.expires is not None and row.expires <= now):
            return False
        row.expires = None if ttl_s is None else now + ttl_s
        return True

    def ttl_left(self, key: str) -> float | None:
        row = self._rows.get(key)
        if row is None or not row.present:
            return 0.0
        return None if row.expires is None else max(0.0, row.expires - self._clock())

    def contains(self, key: str) -> bool:
        row = self._rows.get(key)
        return (
            row is not None and row.present and (row.expires is None or self._clock() < row.expires)
        )

    def stats(self) -> TierStats:
        items = sum(1 for row in self._rows.values() if row.present)
        return TierStats(**{**vars(self._stats), "items": items, "bytes": self._used})

    def check(self) -> list[str]:
        used = sum(row.size for row in self._rows.values() if row.present)
        problems = [] if used == self._used else [f"byte count {self._used} != rows {used}"]
        if set(self._data) != {k for k, row in self._rows.items() if row.present}:
            problems.append("data and index disagree")
        return problems + ([f"over budget: {used}"] if used > self.capacity_bytes else [])

    def close(self) -> None:
        self._rows.clear()
        self._data.clear()

    # -- internals ---------------------------------------------------------------------------

    def _bump(self, key: str, row: _Row | None, now: float) -> None:
        if row is None:
            row = _Row(1.0, now, score(1.0, now, self._rate), next(self._seq))
            self._rows[key] = row
            self._ghosts += 1
            heapq.heappush(self._cold_ghosts, (row.score, row.seq, key))
            self._forget_ghosts()
            return
        row.heat = bump(row.heat, row.last, now, self._rate)
        row.last, row.score = now, score(row.heat, now, self._rate)
        ranking = self._ranked if row.present else self._cold_ghosts
        heapq.heappush(ranking, (row.score, row.seq, key))
        self._compact()

    def _victims(self, needed: int, candidate: float, exclude: str) -> list[str] | None:
        """The entries to evict for `needed` more bytes, coldest first; None when an entry at
        least as hot as `candidate` would have to go, or too little can be freed."""
        excess = self._used + needed - self.capacity_bytes
        if excess <= 0:
            return []
        popped: dict[str, tuple[float, int, str]] = {}
        victims: list[str] = []
        freed = 0
        while self._ranked and freed < excess:
            entry = heapq.heappop(self._ranked)
            row = self._rows.get(entry[2])
            if row is None or not row.present or row.pinned or (row.score, row.seq) != entry[:2]:
                continue  # stale: dropped, pinned, or bumped since
            if entry[2] in popped:
                continue  # a duplicate of a live entry
            popped[entry[2]] = entry
            if entry[2] == exclude:
                continue
            if entry[0] >= candidate:
                break
            victims.append(entry[2])
            freed += row.size
        for entry in popped.values():  # the index is only read: every live entry goes back
            heapq.heappush(self._ranked, entry)
        return victims if freed >= excess else None

    def _evict(self, key: str, now: float) -> tuple[str, bytes, float | None, int | None] | None:
        row = self._rows[key]
        value = self._data[key]
        ttl_left = None if row.expires is None else row.expires - now  # before `_drop` clears it
        self._drop(key, row)
        self._stats.evictions += 1
        return (key, value, ttl_left, None) if ttl_left is None or ttl_left > 0 else None

    def _drop(self, key: str, row: _Row) -> None:
        """The value goes, the heat stays (a ghost row), as the real tier's `_drop_locked`."""
        self._used -= row.size
        row.size, row.present, row.pinned, row.expires = 0, False, False, None
        self._data.pop(key, None)
        self._ghosts += 1
        heapq.heappush(self._cold_ghosts, (row.score, row.seq, key))

    def _forget_ghosts(self) -> None:
        while self._ghosts > self._ghost_limit and self._cold_ghosts:
            value, seq, key = heapq.heappop(self._cold_ghosts)
            row = self._rows.get(key)
            if row is not None and not row.present and (row.score, row.seq) == (value, seq):
                del self._rows[key]
                self._ghosts -= 1

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber the live ones (every hit pushes one)."""
        if len(self._ranked) + len(self._cold_ghosts) < 4 * len(self._rows) + 64:
            return
        live = [(row.score, row.seq, key) for key, row in self._rows.items()]
        rows = self._rows
        self._ranked = [e for e in live if rows[e[2]].present and not rows[e[2]].pinned]
        self._cold_ghosts = [e for e in live if not rows[e[2]].present]
        heapq.heapify(self._ranked)
        heapq.heapify(self._cold_ghosts)


class SimRedisTier:
    """The shared tier as an exact LRU of `capacity` entries with Redis's TTLs (see the module
    docstring); `clock` is the replay's (an expired entry is gone, as Redis's lazy expiry)."""

    shared = True

    def __init__(
        self, capacity: int, name: str = "redis", clock: Callable[[], float] = lambda: 0.0
    ) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.name, self.capacity, self._clock = name, capacity, clock
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._expires: dict[str, float] = {}  # keys with a TTL -> when they expire
        self._stats = TierStats()

    def _live(self, key: str) -> bool:
        """Whether `key` is held, dropping it if its TTL has passed."""
        if key not in self._entries:
            return False
        expires = self._expires.get(key)
        if expires is not None and self._clock() >= expires:
            self.delete(key)
            self._stats.expirations += 1
            return False
        return True

    def get(self, key: str) -> bytes | None:
        if not self._live(key):
            self._stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self._stats.hits += 1
        return self._entries[key]

    def put(self, key: str, value: bytes, *, ttl_s: float | None = None, **_: object) -> bool:
        self._stats.puts += 1
        self._entries[key] = value
        self._entries.move_to_end(key)
        self.touch(key, ttl_s)
        while len(self._entries) > self.capacity:
            oldest, _value = self._entries.popitem(last=False)
            self._expires.pop(oldest, None)
            self._stats.evictions += 1
        return True

    def contains(self, key: str) -> bool:
        return self._live(key)

    def contains_many(self, keys: list[str]) -> list[bool]:
        return [self._live(key) for key in keys]

    def delete(self, key: str) -> bool:
        self._expires.pop(key, None)
        return self._entries.pop(key, None) is not None

    def touch(self, key: str, ttl_s: float | None) -> bool:
        if not self._live(key):
            return False
        if ttl_s is None:
            self._expires.pop(key, None)  # PERSIST
        else:
            self._expires[key] = self._clock() + ttl_s
        return True

    def ttl_left(self, key: str) -> float | None:
        if not self._live(key):
            return 0.0
        expires = self._expires.get(key)
        return None if expires is None else max(0.0, expires - self._clock())

    def stats(self) -> TierStats:
        live = sum(self._live(key) for key in list(self._entries))
        return TierStats(**{**vars(self._stats), "items": live})

    def check(self) -> list[str]:
        return [] if len(self._entries) <= self.capacity else ["over capacity"]

    def close(self) -> None:
        """Nothing to release: the shared tier outlives a node's restart (the replay empties
        it by building a new one per arm)."""

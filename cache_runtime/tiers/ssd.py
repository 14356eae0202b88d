"""The SSD tier: diskcache for the bytes, a SQLite heat index for admission and eviction.

Values live in a `diskcache.Cache` (small values inside its SQLite file, large ones as files,
atomic and safe across processes; its own eviction is off). Each value is stored behind a
16-byte BLAKE2b checksum, verified on every read: a truncated or bit-flipped value is dropped and
counted, never served.

Admission and eviction use heat (`cache_runtime.heat`): every get, hit or miss, bumps the
key's decayed frequency, so a key that keeps missing earns its way in. When the tier is full a
new value is admitted only if it is hotter than the coldest unpinned entries it would displace
(a one-off write cannot flush a hot working set — the TinyLFU idea, with decay instead of a
sketch reset); otherwise the put is refused. Rejected alternatives: diskcache's built-in LFU
(no decay: yesterday's hot keys never leave) and LRU (a warm-up scan evicts the working set).
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import diskcache

from cache_runtime.heat import DEFAULT_HALF_LIFE_S, bump, decay_rate, score
from cache_runtime.tiers.base import EvictionCallback, TierStats

_CHECKSUM_BYTES = 16
_GHOST_LIMIT = 100_000  # keys remembered (heat only) after a miss or an eviction


def _checksum(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=_CHECKSUM_BYTES).digest()


class SSDTier:
    """A local-disk tier shared safely by the processes of one node."""

    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        clock: Callable[[], float] = time.time,
        name: str = "ssd",
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self._rate = decay_rate(half_life_s)
        self._clock = clock
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._data = diskcache.Cache(
            str(self._dir / "data"), eviction_policy="none", size_limit=2**62, cull_limit=0
        )
        self._index_path = self._dir / "heat.sqlite"
        self._local = threading.local()
        self._stats = TierStats(capacity_bytes=capacity_bytes)
        self._stats_lock = threading.Lock()
        self.on_evict: EvictionCallback | None = None
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS heat (key TEXT PRIMARY KEY, heat REAL NOT NULL,"
                " last REAL NOT NULL, score REAL NOT NULL, size INTEGER NOT NULL,"
                " present INTEGER NOT NULL, pinned INTEGER NOT NULL DEFAULT 0,"
                " expires REAL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS heat_rank ON heat (present, pinned, score)")

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self._index_path, timeout=30, isolation_level=None)
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    # -- protocol ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        try:
            now = self._clock()
            stored = self._data.get(key, default=None, retry=True)
            db = self._db()
            with db:
                row = db.execute(
                    "SELECT heat, last, expires FROM heat WHERE key = ?", (key,)
                ).fetchone()
                if row is not None and row[2] is not None and now >= row[2]:
                    self._drop(db, key)
                    self._count(expirations=1, misses=1)
                    return None
                self._bump(db, key, row, now, present=stored is not None, size=None)
            value = self._verified(key, stored)
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1, misses=1)
            return None
        self._count(**({"hits": 1} if value is not None else {"misses": 1}))
        return value

    def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl_s: float | None = None,
        pinned: bool = False,
        parent: str | None = None,
        hint: str | None = None,
        heat: float | None = None,
    ) -> bool:
        """Store `value` if its heat earns the room. `heat`: what the caller already knows of the
        entry's demand (a warm-up from the platform's heat manifest, in decayed requests): it
        starts there instead of at one request, so a block rehydrated after a restart is not the
        first thing evicted just because this disk has not seen it asked for yet."""
        self._count(puts=1)
        size = len(value)
        if size > self.capacity_bytes:
            self._count(rejected=1)
            return False
        now = self._clock()
        try:
            db = self._db()
            with db:
                db.execute("BEGIN IMMEDIATE")  # one admission decision at a time, node-wide
                row = db.execute(
                    "SELECT heat, last, size, present FROM heat WHERE key = ?", (key,)
                ).fetchone()
                candidate_heat = max((row[0] if row else 0.0) or 1.0, heat or 0.0)
                candidate = score(candidate_heat, row[1] if row else now, self._rate)
                freed = row[2] if row and row[3] else 0
                if not pinned and not self._make_room(db, size - freed, candidate, exclude=key):
                    self._count(rejected=1)
                    return False
                if pinned and not self._make_room(db, size - freed, float("inf"), exclude=key):
                    self._count(rejected=1)
                    return False
                self._data.set(key, _checksum(value) + value, retry=True)
                expires = None if ttl_s is None else now + ttl_s
                db.execute(
                    "INSERT INTO heat (key, heat, last, score, size, present, pinned, expires)"
                    " VALUES (?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT(key) DO UPDATE SET"
                    " size = excluded.size, present = 1, pinned = excluded.pinned,"
                    " expires = excluded.expires",
                    (key, candidate_heat, now, candidate, size, int(pinned), expires),
                )
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1)
            return False
        return True

    def delete(self, key: str) -> bool:
        try:
            db = self._db()
            with db:
                present = db.execute("SELECT present FROM heat WHERE key = ?", (key,)).fetchone()
                self._drop(db, key)
            return bool(present and present[0])
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1)
            return False

    def ttl_left(self, key: str) -> float | None:
        entry = self._indexed_expiry(key)
        if entry is None:
            return 0.0
        expires = entry[0]
        return None if expires is None else max(0.0, expires - self._clock())

    def touch(self, key: str, ttl_s: float | None) -> bool:
        expires = None if ttl_s is None else self._clock() + ttl_s
        try:
            with self._db() as db:
                changed = db.execute(
                    "UPDATE heat SET expires = ? WHERE key = ? AND present = 1", (expires, key)
                ).rowcount
        except sqlite3.Error:
            self._count(errors=1)
            return False
        return changed == 1

    def contains(self, key: str) -> bool:
        entry = self._indexed_expiry(key)
        if entry is None:
            return False
        expires = entry[0]
        return (expires is None or self._clock() < expires) and key in self._data

    def _indexed_expiry(self, key: str) -> tuple[float | None] | None:
        """(expiry,) of a stored key from the index; None when absent or unreadable (counted)."""
        try:
            return (
                self._db()
                .execute("SELECT expires FROM heat WHERE key = ? AND present = 1", (key,))
                .fetchone()
            )
        except sqlite3.Error:
            self._count(errors=1)
            return None

    def stats(self) -> TierStats:
        try:
            items, used = (
                self._db()
                .execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM heat WHERE present = 1")
                .fetchone()
            )
        except sqlite3.Error:
            items, used = -1, -1
        with self._stats_lock:
            return TierStats(**{**vars(self._stats), "items": items, "bytes": used})

    def check(self) -> list[str]:
        """Index and data agree, and every stored value matches its checksum."""
        problems = [f"diskcache: {w.message}" for w in self._data.check()]
        indexed = {
            k: size
            for k, size in self._db().execute("SELECT key, size FROM heat WHERE present = 1")
        }
        stored = set(self._data.iterkeys())
        problems += [f"{k}: indexed but no data" for k in sorted(indexed.keys() - stored)]
        problems += [f"{k}: data but not indexed" for k in sorted(stored - indexed.keys())]
        for key in sorted(indexed.keys() & stored):
            raw = self._data.get(key)
            if (
                not isinstance(raw, bytes)
                or _checksum(raw[_CHECKSUM_BYTES:]) != raw[:_CHECKSUM_BYTES]
            ):
                problems.append(f"{key}: checksum mismatch")
            elif len(raw) - _CHECKSUM_BYTES != indexed[key]:
                problems.append(
                    f"{key}: size {len(raw) - _CHECKSUM_BYTES} != indexed {indexed[key]}"
                )
        used = sum(indexed.values())
        if used > self.capacity_bytes:
            problems.append(f"over budget: {used} > {self.capacity_bytes}")
        return problems

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        self._data.close()

    # -- internals ---------------------------------------------------------------------------

    def _verified(
        self, key: str, stored: object, db: sqlite3.Connection | None = None
    ) -> bytes | None:
        if stored is None:
            return None
        if (
            isinstance(stored, bytes)
            and len(stored) >= _CHECKSUM_BYTES
            and _checksum(stored[_CHECKSUM_BYTES:]) == stored[:_CHECKSUM_BYTES]
        ):
            return stored[_CHECKSUM_BYTES:]
        # Corrupt (torn write, bit flip): never serve it, and do not keep it.
        self._count(errors=1)
        if db is not None:
            self._drop(db, key)
        else:
            with self._db() as own:
                self._drop(own, key)
        return None

    def _bump(
        self,
        db: sqlite3.Connection,
        key: str,
        row: tuple | None,
        now: float,
        present: bool,
        size: int | None,
    ) -> None:
        heat = bump(row[0], row[1], now, self._rate) if row else 1.0
        db.execute(
            "INSERT INTO heat (key, heat, last, score, size, present) VALUES (?, ?, ?, ?, 0, ?)"
            " ON CONFLICT(key) DO UPDATE SET heat = excluded.heat, last = excluded.last,"
            " score = excluded.score",
            (key, heat, now, score(heat, now, self._rate), int(present)),
        )
        if row is None and not present:
            self._forget_oldest_ghosts(db)

    def _forget_oldest_ghosts(self, db: sqlite3.Connection) -> None:
        ghosts = db.execute("SELECT COUNT(*) FROM heat WHERE present = 0").fetchone()[0]
        if ghosts > _GHOST_LIMIT:
            db.execute(
                "DELETE FROM heat WHERE key IN (SELECT key FROM heat WHERE present = 0"
                " ORDER BY score LIMIT ?)",
                (ghosts - _GHOST_LIMIT,),
            )

    def _make_room(
        self, db: sqlite3.Connection, needed: int, candidate: float, exclude: str
    ) -> bool:
        used = db.execute("SELECT COALESCE(SUM(size), 0) FROM heat WHERE present = 1").fetchone()[0]
        excess = used + needed - self.capacity_bytes
        if excess <= 0:
            return True
        victims, freed = [], 0
        for key, size, victim_score, expires in db.execute(
            "SELECT key, size, score, expires FROM heat WHERE present = 1 AND pinned = 0"
            " AND key != ? ORDER BY score",
            (exclude,),
        ):
            if victim_score >= candidate:
                return False  # only hotter entries left: the newcomer is not worth their place
            victims.append((key, expires))
            freed += size
            if freed >= excess:
                break
        if freed < excess:
            return False
        now = self._clock()
        for key, expires in victims:
            ttl_left = None if expires is None else expires - now
            if self.on_evict is not None and (ttl_left is None or ttl_left > 0):
                value = self._verified(key, self._data.get(key, retry=True), db)
                if value is not None:  # demoted with the expiry it had, never past it
                    self.on_evict(key, value, ttl_left, None)
            self._data.delete(key, retry=True)
            db.execute("UPDATE heat SET present = 0, size = 0 WHERE key = ?", (key,))
        self._count(evictions=len(victims))
        return True

    def _drop(self, db: sqlite3.Connection, key: str) -> None:
        self._data.delete(key, retry=True)
        db.execute("UPDATE heat SET present = 0, size = 0, pinned = 0 WHERE key = ?", (key,))

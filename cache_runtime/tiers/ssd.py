"""The SSD tier: diskcache for the bytes, a SQLite heat index for admission and eviction.

Values live in a `diskcache.Cache` (small values inside its SQLite file, large ones as files,
atomic and safe across processes; its own eviction is off). Each value is stored behind a
16-byte BLAKE2b checksum, verified on every read: a truncated or bit-flipped value is dropped and
counted, never served (the record format: `ssd_records.py`; the heat index: `ssd_index.py`;
the audit of the two stores: `ssd_audit.py`).

Data and index are two stores, so no write reaches both at once. Each record carries a random
write id that its index row carries too, and a value is served only when its row is present,
unexpired and names the same write. A process that dies between the two writes leaves a record
no row vouches for, and a get that reads one write's record and the next write's row sees two
ids: both are misses, never a value without its TTL or outside the byte budget. Every change to
a key (put, delete, eviction, expiry, clearing such leftovers) holds the index's write lock
(BEGIN IMMEDIATE) across both stores, so under that lock they agree except after a crash. A get
reads without the lock and takes it only when what it read disagrees, or has expired, to look
again before it drops anything: the other side may be a write that just committed. The expiry
lives in the row alone: `touch` renews it without rewriting the value, and the write id already
ties the record to its row.

Admission and eviction use heat (`cache_runtime.heat`): every get, hit or miss, bumps the
key's decayed frequency, so a key that keeps missing earns its way in. When the tier is full a
new value is admitted only if it is hotter than the coldest unpinned entries it would displace
(a one-off write cannot flush a hot working set — the TinyLFU idea, with decay instead of a
sketch reset); otherwise the put is refused. Rejected alternatives: diskcache's built-in LFU
(no decay: yesterday's hot keys never leave) and LRU (a warm-up scan evicts the working set).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import diskcache

from cache_runtime.heat import DEFAULT_HALF_LIFE_S, decay_rate, score
from cache_runtime.tiers import ssd_index as index
from cache_runtime.tiers.base import EvictionCallback, TierStats
from cache_runtime.tiers.ssd_audit import audit
from cache_runtime.tiers.ssd_records import head_of, new_write_id, pack, unpack, write_id_of


class SSDTier:
    """A local-disk tier shared safely by the processes of one node."""

    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        clock: Callable[[], float] = time.time,
        name: str = "ssd",
        lock_timeout_s: float = 5.0,
    ) -> None:
        """`lock_timeout_s`: how long a call waits for another process's write (sqlite's busy
        timeout, for the index and diskcache's): a slow cache is a failing cache, and a put on
        a request path must not wait for a stuck writer elsewhere."""
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self._rate = decay_rate(half_life_s)
        self._clock = clock
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock_timeout_s = lock_timeout_s
        self._data = diskcache.Cache(
            str(self._dir / "data"),
            eviction_policy="none", size_limit=2**62, cull_limit=0, timeout=lock_timeout_s,
        )  # fmt: skip
        self._index_path = self._dir / "heat.sqlite"
        self._local = threading.local()
        self._stats = TierStats(capacity_bytes=capacity_bytes)
        self._stats_lock = threading.Lock()
        self.on_evict: EvictionCallback | None = None
        db = self._db()
        index.create_heat_index(db)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = index.connect(self._index_path, self._lock_timeout_s)
            self._local.db = db
        return db

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    # -- protocol ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """Lock-free when data and row agree (the common hit and miss): record first, then row,
        and serve only a record of the row's write, so a write landing between the two reads
        costs a second look under the lock, never a wrong answer."""
        try:
            now = self._clock()
            stored = self._data.get(key, default=None, retry=True)
            db = self._db()
            value, expired, row = self._served(db, key, stored, index.lookup(db, key), now)
            if expired:
                self._count(expirations=1, misses=1)
                return None
            index.bump_heat(db, key, row, now, self._rate)
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1, misses=1)
            return None
        self._count(**({"hits": 1} if value is not None else {"misses": 1}))
        return value

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """`get` of each key with one index query and one transaction for all their heat
        bumps (a KV chain of 128 pages: one commit, not 128). Records are read before their
        rows, as in `get`, and for the same reason. All None on an error, counted."""
        try:
            now = self._clock()
            stored = [self._data.get(key, default=None, retry=True) for key in keys]
            db = self._db()
            rows = index.lookup_many(db, keys)
            values: list[bytes | None] = []
            bumps, expirations = [], 0
            for key, record in zip(keys, stored, strict=True):
                value, expired, row = self._served(db, key, record, rows.get(key), now)
                values.append(value)
                expirations += expired
                if not expired:
                    bumps.append((key, row))
            with db:
                db.execute("BEGIN IMMEDIATE")
                for key, row in bumps:
                    index.bump_heat(db, key, row, now, self._rate)
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1, misses=len(keys))
            return [None] * len(keys)
        hits = sum(value is not None for value in values)
        self._count(hits=hits, misses=len(keys) - hits, expirations=expirations)
        return values

    def _served(
        self, db: sqlite3.Connection, key: str, stored: bytes | None, row: tuple | None, now: float
    ) -> tuple[bytes | None, bool, tuple | None]:
        """(value, expired, the row to bump) of `key` from its record and row, read lock-free
        in that order; a disagreement between them is settled under the lock (`_settle`)."""
        live = row is not None and row[3] and (row[2] is None or now < row[2])
        record = unpack(stored) if live else None
        if record is not None and record[0] == row[4]:  # type: ignore[index]
            return record[1], False, row
        if stored is None and (row is None or not row[3]):
            return None, False, row  # a plain miss: nothing stored, nothing indexed
        value, expired = self._settle(db, key, now)
        if expired:
            return None, True, None
        return value, False, index.heat_of(db, key)

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
        first thing evicted just because this disk has not seen it asked for yet.

        A put that is refused or fails removes the key's old value: the caller holds a newer
        one, and a hybrid cache that kept it in memory would serve the old one from here once
        memory evicts it."""
        self._count(puts=1)
        size = len(value)
        if size > self.capacity_bytes:
            self._count(rejected=1)
            self._discard(key)
            return False
        now = self._clock()
        write_id = new_write_id()
        demotions: list[tuple[str, bytes, float | None, int | None]] = []
        try:
            db = self._db()
            with db:
                db.execute("BEGIN IMMEDIATE")  # one admission decision at a time, node-wide
                admitted = self._admit_locked(db, key, size, pinned, heat, now, demotions)
                if admitted is None:
                    return False
                self._data.set(key, pack(write_id, value), retry=True)
                expires = None if ttl_s is None else now + ttl_s
                entry_heat, entry_score = admitted
                index.record_write(
                    db, key, entry_heat, now, entry_score, size, pinned, expires, write_id
                )
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1)
            return False
        finally:
            self._demote(demotions)  # after the commit: the next tier may be slow
        return True

    def _admit_locked(
        self,
        db: sqlite3.Connection,
        key: str,
        size: int,
        pinned: bool,
        heat: float | None,
        now: float,
        demotions: list[tuple[str, bytes, float | None, int | None]],
    ) -> tuple[float, float] | None:
        """(heat, score) a put of `size` bytes enters with, once room is made for it (write
        lock held; a pinned value outranks every entry); None, counted, when it is refused,
        and then the key's old value is dropped with the refusal's commit."""
        row = index.admission_of(db, key)
        candidate_heat = max((row[0] if row else 0.0) or 1.0, heat or 0.0)
        candidate = score(candidate_heat, row[1] if row else now, self._rate)
        freed = row[2] if row and row[3] else 0
        if not self._make_room(
            db, size - freed, float("inf") if pinned else candidate, key, demotions
        ):
            self._count(rejected=1)
            if row and row[3]:
                self._drop_locked(db, key)  # committed with the refusal
            return None
        return candidate_heat, candidate

    def _demote(self, demotions: list[tuple[str, bytes, float | None, int | None]]) -> None:
        """Hand evicted values to the next tier, outside the index's write lock: the hybrid
        cache's demoter takes its own lock, and holding both would invert the order in which
        a delete takes them (and every other process's writes would wait on the next tier)."""
        if self.on_evict is None:
            return
        for key, value, ttl_left, written_ns in demotions:
            self.on_evict(key, value, ttl_left, written_ns)

    def delete(self, key: str) -> bool:
        try:
            db = self._db()
            with db:
                db.execute("BEGIN IMMEDIATE")  # a put elsewhere lands wholly before or after
                stored = index.is_stored(db, key)
                self._drop_locked(db, key)
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1)
            return False
        return stored

    def ttl_left(self, key: str) -> float | None:
        entry = self._indexed_expiry(key)
        if entry is None:
            return 0.0
        expires = entry[0]
        return None if expires is None else max(0.0, expires - self._clock())

    def touch(self, key: str, ttl_s: float | None) -> bool:
        """Renew a live entry only: one whose TTL has passed is gone, even if not yet dropped."""
        now = self._clock()
        expires = None if ttl_s is None else now + ttl_s
        try:
            with self._db() as db:
                renewed = index.renew_expiry(db, key, expires, now)
        except sqlite3.Error:
            self._count(errors=1)
            return False
        return renewed

    def contains(self, key: str) -> bool:
        """Whether a get would hit, checksum aside: the record's write id is read, not its
        value (a large value's file is opened for its first bytes only)."""
        entry = self._indexed_expiry(key)
        if entry is None:
            return False
        expires, write_id = entry
        if expires is not None and self._clock() >= expires:
            return False
        try:
            stored = self._data.get(key, default=None, read=True, retry=True)
            if stored is None:
                return False
            head = head_of(stored)
        except (OSError, diskcache.Timeout):
            self._count(errors=1)
            return False
        # a row from before write ids has none (NULL): its record is never vouched for
        return write_id is not None and write_id_of(head) == write_id

    def _indexed_expiry(self, key: str) -> tuple[float | None, int | None] | None:
        """(expiry, write id) of a stored key from the index; None when absent or unreadable
        (counted)."""
        try:
            return index.stored_expiry(self._db(), key)
        except sqlite3.Error:
            self._count(errors=1)
            return None

    def stats(self) -> TierStats:
        try:
            items, used = index.stored_totals(self._db())
        except sqlite3.Error:
            items, used = -1, -1
        with self._stats_lock:
            return TierStats(**{**vars(self._stats), "items": items, "bytes": used})

    def check(self) -> list[str]:
        """Index and data agree, and every stored value matches its checksum."""
        return audit(self._data, self._db(), self.capacity_bytes)

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        self._data.close()

    # -- internals ---------------------------------------------------------------------------

    def _settle(self, db: sqlite3.Connection, key: str, now: float) -> tuple[bytes | None, bool]:
        """(value, expired) of `key`, looked at again under the write lock, where no write is
        half done: a record and row that still disagree are a crash's leftovers (or corrupt),
        and a row still expired at `now` is expired, so either is dropped; a write that
        committed since the lock-free look is served, never dropped."""
        with db:
            db.execute("BEGIN IMMEDIATE")
            row = index.write_of(db, key)
            if row is None or not row[1]:
                self._data.delete(key, retry=True)  # a record no row vouches for
                return None, False
            if row[0] is not None and now >= row[0]:
                self._drop_locked(db, key)
                return None, True
            stored = self._data.get(key, default=None, retry=True)
            record = unpack(stored)
            if record is not None and record[0] == row[2]:
                return record[1], False
            if stored is not None and record is None:
                self._count(errors=1)  # torn or bit-flipped: never served, not kept
            self._drop_locked(db, key)
            return None, False

    def _make_room(
        self,
        db: sqlite3.Connection,
        needed: int,
        candidate: float,
        exclude: str,
        demotions: list[tuple[str, bytes, float | None, int | None]],
    ) -> bool:
        """Evict colder entries until `needed` more bytes fit (write lock held); the values
        worth demoting go to `demotions`, for the caller to hand on after its commit."""
        victims = index.coldest_victims(db, self.capacity_bytes, needed, candidate, exclude)
        if not victims:  # [] when it fits already (no victim needed), None when refused
            return victims is not None
        now = self._clock()
        for key, expires, write_id, written in victims:
            ttl_left = None if expires is None else expires - now
            if self.on_evict is not None and (ttl_left is None or ttl_left > 0):
                stored = self._data.get(key, default=None, retry=True)
                record = unpack(stored)
                if record is not None and record[0] == write_id:
                    # demoted with the expiry it had, never past it, and its write time (the
                    # hybrid cache drops a demotion older than the key's last put or delete)
                    demotions.append((key, record[1], ttl_left, written))
                elif stored is not None and record is None:
                    self._count(errors=1)  # corrupt: dropped below, never demoted
            self._drop_locked(db, key)
        self._count(evictions=len(victims))
        return True

    def _drop_locked(self, db: sqlite3.Connection, key: str) -> None:
        """Forget `key`'s value (its heat stays), the caller holding the write lock: index then
        data, so a crash before the commit leaves a row without its record (a miss that the
        next get clears), never a record without its row."""
        index.forget_value(db, key)
        self._data.delete(key, retry=True)

    def _discard(self, key: str) -> None:
        """Drop `key` after a refused put (best effort: an older copy left behind is of an
        immutable kind, or an answer whose stamp decides whether it is served)."""
        self._drop_all([key])

    def _drop_all(self, keys: list[str]) -> bool:
        """Drop `keys` in one transaction (one wait for the lock, whatever their number);
        False, counted, if it failed."""
        try:
            db = self._db()
            with db:
                db.execute("BEGIN IMMEDIATE")
                for key in keys:
                    self._drop_locked(db, key)
        except (OSError, sqlite3.Error, diskcache.Timeout):
            self._count(errors=1)
            return False
        return True

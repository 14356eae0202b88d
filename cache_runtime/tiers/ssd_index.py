"""The SSD tier's heat index: one SQLite row per key it has seen (see `ssd.py`).

A row holds the key's decayed request frequency (`heat`, `last`, `score`; `cache_runtime.heat`)
and, while the tier stores the key (`present`), its size, pin, expiry, the write id its record
must carry (`wid`) and that write's monotonic time (`written`, for demotions). Rows of keys not
stored are ghosts: heat only, so that a key that keeps missing earns its way in; the coldest
go once there are more than `GHOST_LIMIT`.

Every statement the tier runs on the index lives here, named for what it reads or changes; the
tier (`ssd.py`) decides when, and holds the write lock (BEGIN IMMEDIATE) where a change must
agree with the data store. The tuples returned are the rows' columns in the order each
function's docstring names.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from cache_runtime.heat import bump, score

GHOST_LIMIT = 100_000  # keys remembered (heat only) after a miss or an eviction


def connect(path: Path, timeout_s: float) -> sqlite3.Connection:
    """A connection to the index at `path` that waits `timeout_s` for another writer, in
    autocommit mode (the tier opens its transactions itself, with BEGIN IMMEDIATE)."""
    db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def create_heat_index(db: sqlite3.Connection) -> None:
    """Create the table and its ranking index, or bring an older one up to date; safe when
    several processes open one directory at once."""
    db.execute("PRAGMA journal_mode=WAL")
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "CREATE TABLE IF NOT EXISTS heat (key TEXT PRIMARY KEY, heat REAL NOT NULL,"
            " last REAL NOT NULL, score REAL NOT NULL, size INTEGER NOT NULL,"
            " present INTEGER NOT NULL, pinned INTEGER NOT NULL DEFAULT 0,"
            " expires REAL, wid INTEGER, written INTEGER)"
        )
        columns = {row[1] for row in db.execute("PRAGMA table_info(heat)")}
        if "wid" not in columns:  # an index from before write ids: its records all miss
            db.execute("ALTER TABLE heat ADD COLUMN wid INTEGER")
        if "written" not in columns:  # write times (for demotions) came after write ids
            db.execute("ALTER TABLE heat ADD COLUMN written INTEGER")
        db.execute("CREATE INDEX IF NOT EXISTS heat_rank ON heat (present, pinned, score)")


def bump_heat(db: sqlite3.Connection, key: str, row: tuple | None, now: float, rate: float) -> None:
    """Heat of a get; `row` is the key's (heat, last, ...) read before, or None. A key seen
    first here is a ghost: only a put makes a row present, so a record the index never
    committed is never counted as stored."""
    heat = bump(row[0], row[1], now, rate) if row else 1.0
    db.execute(
        "INSERT INTO heat (key, heat, last, score, size, present) VALUES (?, ?, ?, ?, 0, 0)"
        " ON CONFLICT(key) DO UPDATE SET heat = excluded.heat, last = excluded.last,"
        " score = excluded.score",
        (key, heat, now, score(heat, now, rate)),
    )
    if row is None:
        _forget_oldest_ghosts(db)


def _forget_oldest_ghosts(db: sqlite3.Connection) -> None:
    ghosts = db.execute("SELECT COUNT(*) FROM heat WHERE present = 0").fetchone()[0]
    if ghosts > GHOST_LIMIT:
        db.execute(
            "DELETE FROM heat WHERE key IN (SELECT key FROM heat WHERE present = 0"
            " ORDER BY score LIMIT ?)",
            (ghosts - GHOST_LIMIT,),
        )


def lookup(db: sqlite3.Connection, key: str) -> tuple | None:
    """(heat, last, expires, present, wid) of `key`'s row, or None (a get's one read)."""
    return db.execute(
        "SELECT heat, last, expires, present, wid FROM heat WHERE key = ?", (key,)
    ).fetchone()


def lookup_many(db: sqlite3.Connection, keys: list[str]) -> dict[str, tuple]:
    """key -> (heat, last, expires, present, wid) of the keys indexed, in queries of at most
    500 keys (SQLite's bound on a statement's parameters is 999 in older builds)."""
    rows: dict[str, tuple] = {}
    for start in range(0, len(keys), 500):
        batch = keys[start : start + 500]
        marks = ",".join("?" * len(batch))
        for key, *rest in db.execute(
            f"SELECT key, heat, last, expires, present, wid FROM heat WHERE key IN ({marks})", batch
        ):
            rows[key] = tuple(rest)
    return rows


def heat_of(db: sqlite3.Connection, key: str) -> tuple | None:
    """(heat, last) of `key`'s row, or None: what `bump_heat` needs."""
    return db.execute("SELECT heat, last FROM heat WHERE key = ?", (key,)).fetchone()


def write_of(db: sqlite3.Connection, key: str) -> tuple | None:
    """(expires, present, wid) of `key`'s row, or None: which write the row vouches for."""
    return db.execute("SELECT expires, present, wid FROM heat WHERE key = ?", (key,)).fetchone()


def admission_of(db: sqlite3.Connection, key: str) -> tuple | None:
    """(heat, last, size, present) of `key`'s row, or None: what a put's admission weighs."""
    return db.execute("SELECT heat, last, size, present FROM heat WHERE key = ?", (key,)).fetchone()


def is_stored(db: sqlite3.Connection, key: str) -> bool:
    """Whether the index holds `key` as stored (`present`)."""
    present = db.execute("SELECT present FROM heat WHERE key = ?", (key,)).fetchone()
    return bool(present and present[0])


def stored_expiry(db: sqlite3.Connection, key: str) -> tuple[float | None, int | None] | None:
    """(expires, wid) of a stored key; None when it is not stored."""
    return db.execute(
        "SELECT expires, wid FROM heat WHERE key = ? AND present = 1", (key,)
    ).fetchone()


def stored_totals(db: sqlite3.Connection) -> tuple[int, int]:
    """(items, bytes) of the keys stored."""
    return db.execute(
        "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM heat WHERE present = 1"
    ).fetchone()


def stored_entries(db: sqlite3.Connection) -> dict[str, tuple[int, int | None]]:
    """key -> (size, wid) of every key stored."""
    return {
        key: (size, write_id)
        for key, size, write_id in db.execute("SELECT key, size, wid FROM heat WHERE present = 1")
    }


def record_write(
    db: sqlite3.Connection,
    key: str,
    heat: float,
    now: float,
    candidate: float,
    size: int,
    pinned: bool,
    expires: float | None,
    write_id: int,
) -> None:
    """Index a put's value as stored under `write_id`, stamped with the monotonic time of the
    write. A new row starts at `heat`, `now` and `candidate` (its score); a known key's row
    keeps its heat, last and score."""
    db.execute(
        "INSERT INTO heat (key, heat, last, score, size, present, pinned, expires,"
        " wid, written) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?) ON CONFLICT(key) DO"
        " UPDATE SET size = excluded.size, present = 1, pinned = excluded.pinned,"
        " expires = excluded.expires, wid = excluded.wid, written = excluded.written",
        (
            key, heat, now, candidate, size, int(pinned), expires,
            write_id, time.monotonic_ns(),
        ),
    )  # fmt: skip


def renew_expiry(db: sqlite3.Connection, key: str, expires: float | None, now: float) -> bool:
    """Set a live entry's expiry (stored, and not expired at `now`); whether there was one."""
    return (
        db.execute(
            "UPDATE heat SET expires = ? WHERE key = ? AND present = 1"
            " AND (expires IS NULL OR expires > ?)",
            (expires, key, now),
        ).rowcount
        == 1
    )


def forget_value(db: sqlite3.Connection, key: str) -> None:
    """Mark `key` not stored; its heat stays (a ghost)."""
    db.execute(
        "UPDATE heat SET present = 0, size = 0, pinned = 0, wid = NULL WHERE key = ?", (key,)
    )


def coldest_victims(
    db: sqlite3.Connection, capacity_bytes: int, needed: int, candidate: float, exclude: str
) -> list[tuple[str, float | None, int | None, int | None]] | None:
    """The entries to evict so that `needed` more bytes fit in `capacity_bytes`, coldest
    first, as (key, expires, wid, written): unpinned stored keys other than `exclude`, each
    colder than `candidate` (the newcomer's score). [] when it fits already; None when the
    entries colder than the newcomer cannot free enough."""
    used = db.execute("SELECT COALESCE(SUM(size), 0) FROM heat WHERE present = 1").fetchone()[0]
    excess = used + needed - capacity_bytes
    if excess <= 0:
        return []
    victims, freed = [], 0
    for key, size, victim_score, expires, write_id, written in db.execute(
        "SELECT key, size, score, expires, wid, written FROM heat"
        " WHERE present = 1 AND pinned = 0 AND key != ? ORDER BY score",
        (exclude,),
    ):
        if victim_score >= candidate:
            return None  # only hotter entries left: the newcomer is not worth their place
        victims.append((key, expires, write_id, written))
        freed += size
        if freed >= excess:
            break
    if freed < excess:
        return None
    return victims

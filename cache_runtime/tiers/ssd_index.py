"""The SSD tier's heat index: one SQLite row per key it has seen (see `ssd.py`).

A row holds the key's decayed request frequency (`heat`, `last`, `score`; `cache_runtime.heat`)
and, while the tier stores the key (`present`), its size, pin, expiry, the write id its record
must carry (`wid`) and that write's monotonic time (`written`, for demotions). Rows of keys not
stored are ghosts: heat only, so that a key that keeps missing earns its way in; the coldest
go once there are more than `GHOST_LIMIT`.
"""

from __future__ import annotations

import sqlite3

from cache_runtime.heat import bump, score

GHOST_LIMIT = 100_000  # keys remembered (heat only) after a miss or an eviction


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

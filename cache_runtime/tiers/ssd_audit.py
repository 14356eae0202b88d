"""The SSD tier's consistency audit (`SSDTier.check`): whether its two stores agree.

The tier keeps its values in diskcache and its heat index in SQLite, and serves a value only
when the two agree (see `ssd.py`); the audit lists every way they do not — a row without its
record or a record without its row, a record that fails its checksum, is of another write or
has another size than its row says — and the byte budget overrun, if any. Outside a crash's
leftovers (which a get clears when it meets one) the list is empty.
"""

from __future__ import annotations

import sqlite3

import diskcache

from cache_runtime.tiers.ssd_index import stored_entries
from cache_runtime.tiers.ssd_records import unpack


def audit(data: diskcache.Cache, db: sqlite3.Connection, capacity_bytes: int) -> list[str]:
    """Problems between the records in `data` and the stored rows of the index `db`,
    diskcache's own first, one line each."""
    problems = [f"diskcache: {w.message}" for w in data.check()]
    indexed = stored_entries(db)
    stored = set(data.iterkeys())
    problems += [f"{k}: indexed but no data" for k in sorted(indexed.keys() - stored)]
    problems += [f"{k}: data but not indexed" for k in sorted(stored - indexed.keys())]
    for key in sorted(indexed.keys() & stored):
        size, write_id = indexed[key]
        record = unpack(data.get(key))
        if record is None:
            problems.append(f"{key}: checksum mismatch")
        elif record[0] != write_id:
            problems.append(f"{key}: data is not of the indexed write")
        elif len(record[1]) != size:
            problems.append(f"{key}: size {len(record[1])} != indexed {size}")
    used = sum(size for size, _ in indexed.values())
    if used > capacity_bytes:
        problems.append(f"over budget: {used} > {capacity_bytes}")
    return problems

"""The Parquet lake: append-only, deduplicated, crash-safe tables of contract-validated rows.

The lake layout is part of the contract between the flows that write it and the models that read
it, which is why it lives here and imports only `data_contracts`.

Layout under `root`:

    <table>/<partition>=<value>/part-<batch>.parquet   one file per (batch, partition value)
    _pending/                                          files written but not yet published
    _index.sqlite                                      row keys and committed batches

Every row has a key (for request logs: tenant + request_id). `append` writes only rows whose key
is new, so re-ingesting a file, or a stream consumer re-processing entries that a crashed peer
left unacknowledged, adds nothing. The protocol, under one SQLite write lock shared by all
processes:

    1. publish or discard leftovers of crashed writers (see `_recover`);
    2. drop rows whose key is already indexed;
    3. write the new rows to `_pending/` and fsync;
    4. insert their keys and the batch id, commit;
    5. rename the pending files into place.

A crash before 4 leaves pending files of an uncommitted batch: they are deleted and the rows,
never reported as written, are written again by the retry. A crash between 4 and 5 leaves a
committed batch with pending files: they are renamed into place by the next writer or reader.
Rejected alternatives: deduplicating on read (every reader pays, and counts in the lake lie);
scanning the request_id column of the touched partitions (stale across processes, slow for
large days); a single Parquet file per table rewritten per batch (quadratic).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts.version import CONTRACT_VERSION

_TIMESTAMP = pa.timestamp("ns", tz="UTC")

ARROW_SCHEMAS: dict[str, pa.Schema] = {
    "requests": pa.schema(
        [
            ("timestamp", _TIMESTAMP),
            ("tenant", pa.string()),
            ("request_id", pa.string()),
            ("session_id", pa.string()),
            ("prompt", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("prefix_hashes", pa.list_(pa.int64())),
            ("template_id", pa.string()),
            ("route", pa.string()),
            ("latency_ms", pa.float64()),
            ("priority", pa.int64()),
        ]
    ),
    "quarantine": pa.schema(
        [
            ("source", pa.string()),
            ("row_number", pa.int64()),
            ("raw", pa.string()),
            ("raw_bytes", pa.int64()),
            ("reason", pa.string()),
            ("quarantined_at", _TIMESTAMP),
        ]
    ),
    "demand": pa.schema(
        [
            ("tenant", pa.string()),
            ("key", pa.string()),
            ("granularity", pa.string()),
            ("bucket_start", _TIMESTAMP),
            ("count", pa.float64()),
        ]
    ),
}

# Which columns identify a row, and which column partitions the table on disk.
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "requests": ("tenant", "request_id"),
    "quarantine": ("source", "row_number", "raw"),
    "demand": ("tenant", "key", "granularity", "bucket_start"),
}


def _date_of(column: str) -> Callable[[pd.DataFrame], pd.Series]:
    # Format each distinct day once: strftime on every row cost more than writing the Parquet.
    def dates(df: pd.DataFrame) -> pd.Series:
        days = df[column].dt.floor("D")
        labels = {day: day.strftime("%Y-%m-%d") for day in days.unique()}
        return days.map(labels)

    return dates


PARTITIONS: dict[str, tuple[str, Callable[[pd.DataFrame], pd.Series]]] = {
    "requests": ("date", _date_of("timestamp")),
    "quarantine": ("date", _date_of("quarantined_at")),
    "demand": ("granularity", lambda df: df["granularity"]),
}


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What one `append` did: rows newly written, and rows skipped because already present."""

    written: int
    duplicates: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Lake:
    """A directory of deduplicated Parquet tables; safe to share between processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.pending = self.root / "_pending"
        self.pending.mkdir(parents=True, exist_ok=True)
        self._index_path = self.root / "_index.sqlite"
        with closing(self._connect()) as db, db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS batches ("
                " id INTEGER PRIMARY KEY, batch TEXT UNIQUE NOT NULL, tbl TEXT NOT NULL,"
                " rows INTEGER NOT NULL, contract TEXT NOT NULL,"
                " created_at TEXT DEFAULT CURRENT_TIMESTAMP)"
            )
            for table in ARROW_SCHEMAS:
                # A row key is stored as a 128-bit BLAKE2b digest: fixed-size keys make the index
                # several times faster than the key text, and a collision (a new row taken for a
                # duplicate) has probability ~n^2/2^129, nil at any realistic lake size.
                db.execute(
                    f"CREATE TABLE IF NOT EXISTS keys_{table} ("
                    " key BLOB PRIMARY KEY, batch INTEGER NOT NULL) WITHOUT ROWID"
                )

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._index_path, timeout=60, isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")
        return db

    # -- writing -----------------------------------------------------------------------------

    def append(self, table: str, frame: pd.DataFrame) -> AppendResult:
        """Write the rows of `frame` whose key is not yet in `table`; return what happened.

        `frame` must already be validated against the table's contract (callers validate at the
        boundary; re-validating here would double the cost of ingestion).
        """
        schema = ARROW_SCHEMAS[table]
        if list(frame.columns) != schema.names:
            raise ValueError(f"{table}: columns {list(frame.columns)} != {schema.names}")
        if frame.empty:
            return AppendResult(0, 0)
        keys = _row_keys(frame, ROW_KEYS[table])
        batch = uuid.uuid4().hex
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                self._recover(db)
                cursor = db.execute(
                    "INSERT INTO batches (batch, tbl, rows, contract) VALUES (?, ?, 0, ?)",
                    (batch, table, CONTRACT_VERSION),
                )
                batch_id = cursor.lastrowid
                fresh = _insert_new_keys(db, table, keys, batch_id)
                new_rows = frame[fresh]
                if new_rows.empty:
                    db.execute("ROLLBACK")
                    return AppendResult(0, len(frame))
                pending = self._write_pending(table, batch, new_rows)
                db.execute("UPDATE batches SET rows = ? WHERE id = ?", (len(new_rows), batch_id))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                for leftover in self.pending.glob(f"*__{batch}.parquet"):
                    leftover.unlink(missing_ok=True)
                raise
        for path in pending:
            self._publish(path)
        return AppendResult(len(new_rows), len(frame) - len(new_rows))

    def _write_pending(self, table: str, batch: str, rows: pd.DataFrame) -> list[Path]:
        column, partition_of = PARTITIONS[table]
        written = []
        for value, part in rows.groupby(partition_of(rows), sort=True):
            path = self.pending / f"{table}__{column}={value}__{batch}.parquet"
            arrow = pa.Table.from_pandas(part, schema=ARROW_SCHEMAS[table], preserve_index=False)
            arrow = arrow.replace_schema_metadata({"preheat.contract": CONTRACT_VERSION})
            with open(path, "wb") as sink:
                pq.write_table(arrow, sink, compression="zstd")
                sink.flush()
                os.fsync(sink.fileno())
            written.append(path)
        _fsync_dir(self.pending)
        return written

    def _publish(self, pending: Path) -> None:
        table, partition, batch = pending.stem.split("__")
        target_dir = self.root / table / partition
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"part-{batch}.parquet"
        try:
            os.replace(pending, target)
        except FileNotFoundError:
            # The writer publishes after releasing the lock, so another process's `_recover` may
            # have published this committed file first. Only a missing target is an error.
            if not target.exists():
                raise
        _fsync_dir(target_dir)

    def _recover(self, db: sqlite3.Connection) -> None:
        """Publish pending files of committed batches; delete those of batches never committed.

        Must run with the write lock held, so a live writer's pending files are never touched.
        """
        for path in sorted(self.pending.glob("*.parquet")):
            batch = path.stem.rsplit("__", 1)[-1]
            committed = db.execute(
                "SELECT 1 FROM batches WHERE batch = ? AND rows > 0", (batch,)
            ).fetchone()
            if committed:
                self._publish(path)
            else:
                path.unlink(missing_ok=True)

    def recover(self) -> None:
        """Finish what a crashed writer left; readers call this so they never miss a commit."""
        if not any(self.pending.glob("*.parquet")):
            return
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                self._recover(db)
            finally:
                db.execute("COMMIT")

    # -- reading -----------------------------------------------------------------------------

    def files(self, table: str) -> list[Path]:
        return sorted((self.root / table).glob("*/part-*.parquet"))

    def read(self, table: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Read a whole table as a frame with the contract's columns (empty when none yet)."""
        self.recover()
        schema = ARROW_SCHEMAS[table]
        files = self.files(table)
        if not files:
            empty = schema.empty_table().to_pandas(types_mapper=arrow_types)
            return empty[list(columns or schema.names)]
        arrow = pa.concat_tables(pq.read_table(f, schema=schema, columns=columns) for f in files)
        return arrow.to_pandas(types_mapper=arrow_types)

    def count(self, table: str) -> int:
        """Rows in a table, from the index (no file is opened)."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT COALESCE(SUM(rows), 0) FROM batches WHERE tbl = ?", (table,))
            return int(row.fetchone()[0])


def arrow_types(arrow_type: pa.DataType) -> pd.ArrowDtype | None:
    """Keep text and list columns Arrow-backed when reading (the contracts' dtypes)."""
    if pa.types.is_string(arrow_type) or pa.types.is_list(arrow_type):
        return pd.ArrowDtype(arrow_type)
    return None


def _row_keys(frame: pd.DataFrame, columns: tuple[str, ...]) -> list[bytes]:
    """128-bit digests of each row's key columns (timestamps by their integer nanoseconds)."""
    parts = [
        (frame[c].astype("int64") if frame[c].dtype.kind == "M" else frame[c]).tolist()
        for c in columns
    ]
    # Length-prefixed fields: free-text tenants and ids could otherwise contain the separator
    # and make two different keys encode alike ("a|x" + "y" vs "a" + "x|y").
    return [
        hashlib.blake2b(
            "".join(f"{len(text)}:{text}" for text in map(str, values)).encode(), digest_size=16
        ).digest()
        for values in zip(*parts, strict=True)
    ]


def _insert_new_keys(
    db: sqlite3.Connection, table: str, keys: list[bytes], batch_id: int
) -> np.ndarray:
    """Index the keys not seen before; return a mask of the rows that are new.

    The common case, all keys new, is one bulk insert. Only when it hits a duplicate is the
    transaction rolled back to a savepoint and each key probed.
    """
    insert = f"INSERT INTO keys_{table} (key, batch) VALUES (?, ?)"
    db.execute("SAVEPOINT bulk")
    try:
        # Sorted inserts append to the B-tree instead of splitting random pages: 2x faster.
        db.executemany(insert, ((k, batch_id) for k in sorted(keys)))
        db.execute("RELEASE bulk")
        return np.ones(len(keys), dtype=bool)
    except sqlite3.IntegrityError:
        db.execute("ROLLBACK TO bulk")
        db.execute("RELEASE bulk")
    fresh = np.zeros(len(keys), dtype=bool)
    seen: set[bytes] = set()
    probe = f"INSERT OR IGNORE INTO keys_{table} (key, batch) VALUES (?, ?)"
    for i, key in enumerate(keys):
        if key in seen:
            continue
        seen.add(key)
        fresh[i] = db.execute(probe, (key, batch_id)).rowcount == 1
    return fresh


def lake_of(data_dir: str | Path) -> Lake:
    """The lake of a data directory: `<data_dir>/lake`, where every stage reads and writes."""
    return Lake(Path(data_dir) / "lake")

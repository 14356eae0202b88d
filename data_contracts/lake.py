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

import os
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

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
    return lambda df: df[column].dt.strftime("%Y-%m-%d")


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
                "CREATE TABLE IF NOT EXISTS row_keys ("
                " tbl TEXT NOT NULL, key TEXT NOT NULL, batch TEXT NOT NULL,"
                " PRIMARY KEY (tbl, key)) WITHOUT ROWID"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS batches ("
                " batch TEXT PRIMARY KEY, tbl TEXT NOT NULL, rows INTEGER NOT NULL,"
                " contract TEXT NOT NULL, created_at TEXT DEFAULT CURRENT_TIMESTAMP)"
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
                present = _present_keys(db, table, keys)
                fresh = ~keys.isin(present).to_numpy()
                new_rows, new_keys = frame[fresh], keys[fresh]
                if new_rows.empty:
                    db.execute("COMMIT")
                    return AppendResult(0, len(frame))
                pending = self._write_pending(table, batch, new_rows)
                db.executemany(
                    "INSERT INTO row_keys (tbl, key, batch) VALUES (?, ?, ?)",
                    ((table, k, batch) for k in new_keys),
                )
                db.execute(
                    "INSERT INTO batches (batch, tbl, rows, contract) VALUES (?, ?, ?, ?)",
                    (batch, table, len(new_rows), CONTRACT_VERSION),
                )
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
        os.replace(pending, target_dir / f"part-{batch}.parquet")
        _fsync_dir(target_dir)

    def _recover(self, db: sqlite3.Connection) -> None:
        """Publish pending files of committed batches; delete those of batches never committed.

        Must run with the write lock held, so a live writer's pending files are never touched.
        """
        for path in sorted(self.pending.glob("*.parquet")):
            batch = path.stem.rsplit("__", 1)[-1]
            committed = db.execute("SELECT 1 FROM batches WHERE batch = ?", (batch,)).fetchone()
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
            return schema.empty_table().to_pandas()[list(columns or schema.names)]
        arrow = pa.concat_tables(pq.read_table(f, schema=schema, columns=columns) for f in files)
        return arrow.to_pandas()

    def count(self, table: str) -> int:
        """Rows in a table, from the index (no file is opened)."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT COALESCE(SUM(rows), 0) FROM batches WHERE tbl = ?", (table,))
            return int(row.fetchone()[0])


def _row_keys(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.Series:
    parts = [frame[c].astype("int64") if frame[c].dtype.kind == "M" else frame[c] for c in columns]
    key = parts[0].astype(str)
    for part in parts[1:]:
        key = key + "\x1f" + part.astype(str)
    return key.reset_index(drop=True)


def _present_keys(db: sqlite3.Connection, table: str, keys: pd.Series) -> set[str]:
    db.execute("CREATE TEMP TABLE IF NOT EXISTS probe (key TEXT PRIMARY KEY) WITHOUT ROWID")
    db.execute("DELETE FROM probe")
    db.executemany("INSERT OR IGNORE INTO probe (key) VALUES (?)", ((k,) for k in keys))
    rows = db.execute(
        "SELECT probe.key FROM probe JOIN row_keys ON row_keys.tbl = ? AND row_keys.key = probe.key",
        (table,),
    )
    return {r[0] for r in rows}

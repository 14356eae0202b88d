"""File ingestion: records -> contract rows -> lake, with every rejected row quarantined.

Invariant per file: `accepted + quarantined == read`. `accepted` counts rows that passed the
contract, including `duplicates` (rows the lake already had, or repeated within the file), so
`written = accepted - duplicates` is what this run added. Work is done in chunks; a chunk's rows
are committed to the lake before they are counted, so a crash loses nothing already reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path

import pandas as pd

from data_contracts import DemandSeries, RequestLog, failures_by_row
from data_contracts.lake import ROW_KEYS, Lake
from data_contracts.quarantine import QuarantineRow
from data_contracts.validation import row_schema
from models.ingest.detect import resolve_format
from models.ingest.formats import DEFAULT_EPOCH, FastPathMiss, Format, SourceContext
from models.ingest.readers import Record, RowError, raw_text

CHUNK_ROWS = 50_000
_CONTRACTS = {"requests": RequestLog, "demand": DemandSeries}
_ROW_SCHEMAS = {table: row_schema(model) for table, model in _CONTRACTS.items()}


@dataclass
class FileReport:
    """Counts for one file; `accepted + quarantined == read` always holds."""

    path: str
    format: str
    table: str
    read: int = 0
    accepted: int = 0
    quarantined: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def written(self) -> int:
        return self.accepted - self.duplicates

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "written": self.written}


@dataclass
class ChunkResult:
    """One chunk's outcome before it is committed to the lake."""

    good: pd.DataFrame
    quarantine: pd.DataFrame
    read: int
    repeated: int


def record_chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    """`records` in lists of at most `size`, read as they are needed: a file is never held whole."""
    iterator = iter(records)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _reason_kind(reason: str) -> str:
    """A short label for grouping reasons in summaries: the text before the first colon."""
    return reason.split(":", 1)[0].split(" (", 1)[0][:60]


def quarantine_frame(source: str, rows: list[tuple[int, bytes, str]]) -> pd.DataFrame:
    """Rows (row number, raw bytes, reason) as a validated `QuarantineRow` frame."""
    frame = pd.DataFrame(
        {
            "source": source,
            "row_number": [r[0] for r in rows],
            "raw": [raw_text(r[1]) for r in rows],
            "raw_bytes": [len(r[1]) for r in rows],
            "reason": [r[2] for r in rows],
            "quarantined_at": pd.Timestamp.now(tz="UTC"),
        }
    )
    return QuarantineRow.validate(frame)


# At or below this many records a run that missed the fast path is parsed row by row rather than
# split again: bisecting further costs more Arrow calls than it saves.
SLOW_PATH_ROWS = 256


def _parse_rows(
    fmt: Format, records: list[Record], ctx: SourceContext, rejected: list[tuple[int, bytes, str]]
) -> list[pd.DataFrame]:
    """Frames for `records`: fast path where a whole run is clean, bisecting around bad rows."""
    if not records:
        return []
    try:
        return [fmt.fast_frame([r[0] for r in records], [r[2] for r in records], ctx)]
    except FastPathMiss:
        if len(records) > SLOW_PATH_ROWS:
            middle = len(records) // 2
            left = _parse_rows(fmt, records[:middle], ctx, rejected)
            return left + _parse_rows(fmt, records[middle:], ctx, rejected)
    rows: list[tuple] = []
    numbers: list[int] = []
    for number, value, raw in records:
        try:
            rows.append(fmt.parse(value, number, raw, ctx))
        except RowError as err:
            rejected.append((number, raw, str(err)))
            continue
        numbers.append(number)
    if not rows:
        return []
    frame = pd.DataFrame.from_records(rows, columns=fmt.columns, index=numbers)
    return [fmt.finalize(frame, ctx)]


def process_chunk(fmt: Format, chunk: list[Record], ctx: SourceContext) -> ChunkResult:
    """Parse, convert and validate one chunk; nothing is written here."""
    raws = {number: raw for number, _, raw in chunk}
    rejected = [(n, raw, str(v)) for n, v, raw in chunk if isinstance(v, RowError)]
    decodable = [r for r in chunk if not isinstance(r[1], RowError)]
    frames = [f for f in _parse_rows(fmt, decodable, ctx, rejected) if not f.empty]
    frame = pd.concat(frames) if frames else pd.DataFrame(columns=fmt.columns)
    time_column = "timestamp" if fmt.table == "requests" else "bucket_start"
    unconvertible = frame[time_column].isna()
    for number in frame.index[unconvertible]:
        rejected.append((number, raws[number], f"{time_column}: unparseable or out of range"))
    frame = frame[~unconvertible]
    good, failures = failures_by_row(_ROW_SCHEMAS[fmt.table], frame)
    rejected.extend((int(f.index), raws[int(f.index)], f.reason) for f in failures)
    repeated = good.duplicated(subset=list(ROW_KEYS[fmt.table]), keep="first")
    good = _CONTRACTS[fmt.table].validate(good[~repeated], lazy=True)
    rejected.sort(key=lambda r: r[0])
    return ChunkResult(
        good, quarantine_frame(ctx.source, rejected), len(chunk), int(repeated.sum())
    )


def ingest_file(
    path: Path,
    lake: Lake,
    format_name: str = "auto",
    tenant: str = "default",
    epoch: pd.Timestamp | None = None,
    chunk_rows: int = CHUNK_ROWS,
    on_chunk: Callable[[FileReport], None] | None = None,
) -> FileReport:
    """Ingest one file into `lake`; raises `InputError` if the file as a whole is unusable."""
    started = time.perf_counter()
    fmt = resolve_format(path, format_name)
    source = str(path.resolve())
    ctx = SourceContext(
        source=source, tenant=tenant, epoch=DEFAULT_EPOCH if epoch is None else epoch
    )
    report = FileReport(path=str(path), format=fmt.name, table=fmt.table)
    for chunk in record_chunks(fmt.records(path), chunk_rows):
        result = process_chunk(fmt, chunk, ctx)
        appended = lake.append(fmt.table, result.good)
        lake.append("quarantine", result.quarantine)
        report.read += result.read
        report.accepted += len(result.good) + result.repeated
        report.duplicates += appended.duplicates + result.repeated
        report.quarantined += len(result.quarantine)
        for reason in result.quarantine["reason"]:
            kind = _reason_kind(reason)
            report.reasons[kind] = report.reasons.get(kind, 0) + 1
        report.seconds = time.perf_counter() - started
        if on_chunk is not None:
            on_chunk(report)
    report.seconds = time.perf_counter() - started
    return report

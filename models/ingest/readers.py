"""Read raw records out of files without ever crashing on what is inside them.

Each reader yields `(row_number, value, raw)`: the 1-based line (or row) number, the value (the
line's bytes, its fields or a dict, by reader) or a `RowError` saying why the row cannot even be
decoded, and the raw bytes, capped at RAW_LIMIT_BYTES, that the quarantine keeps and that derived
ids are hashed from.
Blank lines are not rows (a trailing newline must not become a quarantined row) and are skipped.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from data_contracts.quarantine import RAW_LIMIT_BYTES

# A line longer than this is not a request log line (a 10 MB line is a bug upstream): it is
# quarantined without being parsed, and only its first RAW_LIMIT_BYTES are kept.
MAX_LINE_BYTES = 1024 * 1024

Record = tuple[int, Any, bytes]


class RowError(ValueError):
    """A row that cannot become a contract row; the message is its quarantine reason."""


class InputError(ValueError):
    """The file as a whole cannot be ingested (unreadable, unknown format, wrong header)."""


def raw_text(raw: bytes) -> str:
    """The quarantine's text of a raw row: invalid UTF-8 kept visible as backslash escapes."""
    return raw.decode("utf-8", errors="backslashreplace")


def _decode(data: bytes) -> str | RowError:
    if b"\x00" in data:
        return RowError("binary data: NUL byte in line")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        return RowError(f"not valid UTF-8 at byte {err.start}")


def _bounded_lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, bytes, int]]:
    """Yield (line number, at most `max_line_bytes` of the line, full length in bytes)."""
    with open(path, "rb") as handle:
        number = 0
        while True:
            line = handle.readline(max_line_bytes + 1)
            if not line:
                return
            number += 1
            length = len(line)
            if length > max_line_bytes and not line.endswith(b"\n"):
                # Drain the rest of an over-long line in bounded pieces: never hold it in memory.
                while True:
                    more = handle.readline(max_line_bytes)
                    length += len(more)
                    if not more or more.endswith(b"\n"):
                        break
            yield number, line, length


def read_byte_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Record]:
    """Lines as bytes (value and raw are the same object); over-long lines become `RowError`.

    Decoding is left to the parser: orjson validates UTF-8 itself, and the fast path hands whole
    chunks of lines to Arrow without touching them one by one in Python.
    """
    for number, line, length in _bounded_lines(path, max_line_bytes):
        if length > max_line_bytes:
            reason = RowError(f"line too long: {length} bytes > {max_line_bytes}")
            yield number, reason, line[:RAW_LIMIT_BYTES]
            continue
        line = line.rstrip(b"\r\n")
        if not line.strip():
            continue
        yield number, line, line


def read_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Record]:
    """Lines decoded as UTF-8; lines that are not text become `RowError` values."""
    for number, line, raw in read_byte_lines(path, max_line_bytes):
        yield number, (line if isinstance(line, RowError) else _decode(line)), raw


def parse_json_object(line: bytes) -> dict[str, Any]:
    """One JSON object from a line; `RowError` saying why when it is not one."""
    if b"\x00" in line:
        raise RowError("binary data: NUL byte in line")
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise RowError(f"not valid JSON: {str(err).split(':')[0]}") from None
    if not isinstance(value, dict):
        raise RowError(f"not a JSON object: {type(value).__name__}")
    return value


def read_simple_csv(
    path: Path, expected_header: list[str], max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[Record]:
    """Rows of a CSV without quoting (trace exports): split on commas, check the field count.

    Rejected alternative: the `csv` module, 3x slower and no more correct for these files, whose
    fields never contain commas or quotes; `read_csv_records` handles CSVs that need quoting.
    """
    lines = read_lines(path, max_line_bytes)
    header = next(lines, None)
    if header is None or isinstance(header[1], RowError):
        raise InputError(f"{path}: no readable CSV header")
    got = [h.strip() for h in header[1].split(",")]
    if got != expected_header:
        raise InputError(
            f"{path}: expected CSV header {','.join(expected_header)}, got {header[1][:200]}"
        )
    width = len(expected_header)
    for number, text, raw in lines:
        if isinstance(text, RowError):
            yield number, text, raw
            continue
        fields = text.split(",")
        if len(fields) != width:
            yield number, RowError(f"expected {width} fields, got {len(fields)}"), raw
            continue
        yield number, fields, raw


def read_csv_records(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Record]:
    """Rows of a quoted CSV (fields may span lines) as dicts keyed by the header."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with open(path, "rb") as handle:
        text = io.TextIOWrapper(handle, encoding="utf-8", errors="replace", newline="")
        reader = csv.reader(text)
        try:
            header = next(reader)
        except (StopIteration, csv.Error) as err:
            raise InputError(f"{path}: no readable CSV header ({err})") from err
        header = [h.strip() for h in header]
        while True:
            start = reader.line_num + 1
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                yield start, RowError(f"malformed CSV: {err}"), ""
                continue
            text = ",".join(fields)
            if not any(f.strip() for f in fields):
                continue
            raw = text.encode()[:RAW_LIMIT_BYTES]
            if len(text) > max_line_bytes:
                yield start, RowError(f"row too long: > {max_line_bytes} bytes"), raw
            elif "\ufffd" in text or "\x00" in text:
                yield start, RowError("not valid UTF-8 or binary data"), raw
            elif len(fields) != len(header):
                yield start, RowError(f"expected {len(header)} fields, got {len(fields)}"), raw
            else:
                yield start, dict(zip(header, fields, strict=True)), raw


def read_parquet_records(path: Path, batch_rows: int = 65_536) -> Iterator[Record]:
    """Rows of a Parquet file as dicts; the raw text kept for quarantine is the row as JSON."""
    import pyarrow.parquet as pq

    try:
        source = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several unrelated types for a corrupt file
        raise InputError(f"{path}: not a readable Parquet file ({err})") from err
    number = 0
    for batch in source.iter_batches(batch_size=batch_rows):
        for row in batch.to_pylist():
            number += 1
            yield number, row, orjson.dumps(row, default=str)[:RAW_LIMIT_BYTES]

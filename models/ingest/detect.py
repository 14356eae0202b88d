"""Choose the format of a file: by name (`--format`) or by sniffing its first record."""

from __future__ import annotations

from pathlib import Path

import orjson

from models.ingest.formats import Azure, Format, Mooncake, ServeGen
from models.ingest.formats_generic import Generic, Prompts
from models.ingest.readers import InputError

FORMAT_NAMES = ("auto", "jsonl", "mooncake", "azure", "servegen", "prompts")
_SNIFF_BYTES = 1024 * 1024


def _first_line(path: Path) -> str:
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                return line[:_SNIFF_BYTES].decode("utf-8", errors="replace").strip()
            if handle.tell() > _SNIFF_BYTES:
                break
    raise InputError(f"{path}: empty file")


def _reader_for(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise InputError(
        f"{path}: unknown file type {suffix or '(none)'}; use .jsonl, .csv or .parquet"
    )


def _sniff(path: Path, reader: str) -> Format:
    if reader == "parquet":
        return Generic("parquet")
    first = _first_line(path)
    if reader == "csv":
        header = [h.strip().strip('"') for h in first.split(",")]
        if header == Azure.header:
            return Azure()
        if header == ServeGen.header:
            return ServeGen()
        if "prompt" in header and "prompt_tokens" not in header:
            return Prompts("csv")
        if "timestamp" in header:
            return Generic("csv")
        raise InputError(f"{path}: cannot tell the format from CSV header {first[:120]!r}")
    try:
        record = orjson.loads(first)
    except orjson.JSONDecodeError:
        raise InputError(f"{path}: first line is not JSON; cannot detect the format") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}: first line is not a JSON object; cannot detect the format")
    if {"input_length", "output_length", "hash_ids"} <= record.keys():
        return Mooncake()
    if "question" in record or ("prompt" in record and "prompt_tokens" not in record):
        return Prompts("jsonl")
    if "timestamp" in record:
        return Generic("jsonl")
    raise InputError(f"{path}: cannot tell the format from keys {sorted(record)[:8]}")


def resolve_format(path: Path, name: str) -> Format:
    """The `Format` for `path`; `InputError` when it is unreadable or the name is unknown."""
    if name not in FORMAT_NAMES:
        raise InputError(f"unknown format {name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from err
    reader = _reader_for(path)
    if name == "auto":
        return _sniff(path, reader)
    if name == "mooncake":
        return Mooncake()
    if name == "azure":
        return Azure()
    if name == "servegen":
        return ServeGen()
    if name == "prompts":
        return Prompts("csv" if reader == "csv" else "jsonl")
    return Generic(reader)

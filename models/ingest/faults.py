"""Corrupt a log file the ways real logs break, to prove ingestion keeps its invariants.

Used by the tests and `benchmarks/ingest.py`; each corruption is one that was seen in the wild:
a writer killed mid-line, a disk block of garbage, a type change upstream, a negative counter,
a clock off by decades, an unbounded field.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson

CORRUPTIONS = ("truncated", "binary", "wrong_type", "negative", "timestamp", "huge")


def _count_key(record: dict) -> str:
    return next(k for k in record if "length" in k or "tokens" in k.lower())


def _wrong_type(record: dict) -> dict:
    key = _count_key(record)
    return {**record, key: str(record[key]) + "x"}


def corrupt_line(line: bytes, kind: str, rng: random.Random) -> bytes:
    """One corrupted version of a JSONL line (or CSV line for `truncated`/`binary`/`huge`)."""
    if kind == "truncated":
        return line[: max(1, len(line) // 2)]
    if kind == "binary":
        return bytes(rng.getrandbits(8) for _ in range(64)).replace(b"\n", b"\x00")
    if kind == "huge":
        return line[:-1] + b', "pad": "' + b"A" * (10 * 1024 * 1024) + b'"}'
    record = orjson.loads(line)
    if kind == "wrong_type":
        return orjson.dumps(_wrong_type(record))
    if kind == "negative":
        key = _count_key(record)
        return orjson.dumps({**record, key: -abs(int(record[key])) - 1})
    if kind == "timestamp":
        stamp = record["timestamp"]
        far = 10**19 if isinstance(stamp, int | float) else "1899-12-31T00:00:00Z"
        return orjson.dumps({**record, "timestamp": far})
    raise ValueError(f"unknown corruption {kind!r}; choose from {CORRUPTIONS}")


def corrupt_jsonl(
    source: Path, target: Path, fraction: float = 0.05, seed: int = 0
) -> dict[int, str]:
    """Copy `source` to `target` with `fraction` of its lines corrupted; return {line: kind}."""
    rng = random.Random(seed)
    lines = source.read_bytes().splitlines()
    chosen = sorted(rng.sample(range(len(lines)), k=max(1, int(len(lines) * fraction))))
    kinds = {}
    for i, index in enumerate(chosen):
        kind = CORRUPTIONS[i % len(CORRUPTIONS)]
        lines[index] = corrupt_line(lines[index], kind, rng)
        kinds[index + 1] = kind
    target.write_bytes(b"\n".join(lines) + b"\n")
    return kinds

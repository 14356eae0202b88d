"""Ingestion throughput: validated rows/s on one core, next to the obvious alternatives.

Prints one JSON object. For each input (Mooncake JSONL, the generic JSONL log, Azure CSV):
- `preheat_validate_rows_per_s`: parse + contract validation with quarantine bookkeeping
  (what `preheat ingest` does before writing), the number the goal is stated in;
- `preheat_end_to_end_rows_per_s`: the same plus the deduplicated, crash-safe lake write;
- `pandas_naive_rows_per_s`: what a practitioner writes first — `pandas.read_json(lines=True)`
  (or `read_csv`) then the same pandera contract — which cannot quarantine row by row and
  crashes on the first malformed line;
- `arrow_parse_only_rows_per_s`: Arrow's JSON/CSV reader with no validation at all, the ceiling.
Ratios are against the naive pandas pipeline. Goal: >= 100,000 validated rows/s for Mooncake.

Usage: python benchmarks/ingest.py [--rows 200000] [--shared ../shared/data]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

from models.evaluation.bench.shared_data import add_shared_argument


def pin_to_one_core() -> None:
    import pyarrow as pa

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    os.environ["OMP_NUM_THREADS"] = "1"


def mooncake_file(target: Path, rows: int, shared: Path) -> Path:
    """The real Mooncake trace repeated (shifted in time) to `rows` lines, or a generated one."""
    source = shared / "traces" / "mooncake_synthetic_trace.jsonl"
    if source.is_file():
        base = [orjson.loads(line) for line in source.read_bytes().splitlines()]
    else:  # no ../shared (a user's clone): same shape, generated
        base = [{"timestamp": i * 100, "input_length": 8000, "output_length": 20,
                 "hash_ids": list(range(i, i + 16))} for i in range(4000)]  # fmt: skip
    span = base[-1]["timestamp"] + 1
    with open(target, "wb") as sink:
        for i in range(rows):
            record = dict(base[i % len(base)])
            record["timestamp"] += (i // len(base)) * span
            sink.write(orjson.dumps(record) + b"\n")
    return target


def generic_file(target: Path, rows: int) -> Path:
    from models.ingest.synthetic import SyntheticLogSpec, write_synthetic_log

    write_synthetic_log(target, SyntheticLogSpec(days=rows / 15_000, requests_per_day=15_000))
    return target


def azure_file(target: Path, rows: int, shared: Path) -> Path:
    source = shared / "traces" / "azure_llm_code_2023.csv"
    if source.is_file():
        lines = source.read_text().splitlines()[1:]
    else:
        minutes_seconds = [(m, s) for m in range(60) for s in range(60)]
        lines = [
            f"2023-11-16 18:{m:02d}:{s:02d}.1234567,{100 + s},{7 + m}" for m, s in minutes_seconds
        ]
    with open(target, "w") as sink:
        sink.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for i in range(rows):
            sink.write(lines[i % len(lines)] + "\n")
    return target


def rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1)


def preheat_validate(path: Path, fmt_name: str) -> tuple[int, float]:
    from models.ingest.detect import resolve_format
    from models.ingest.formats import SourceContext
    from models.ingest.pipeline import CHUNK_ROWS, process_chunk, record_chunks

    started = time.perf_counter()
    fmt = resolve_format(path, fmt_name)
    ctx = SourceContext(source=str(path))
    rows = 0
    for chunk in record_chunks(fmt.records(path), CHUNK_ROWS):
        result = process_chunk(fmt, chunk, ctx)
        rows += len(result.good) + result.repeated + len(result.quarantine)
    return rows, time.perf_counter() - started


def preheat_end_to_end(path: Path, fmt_name: str) -> tuple[int, float]:
    from data_contracts.lake import Lake
    from models.ingest.pipeline import ingest_file

    with tempfile.TemporaryDirectory() as lake_dir:
        report = ingest_file(path, Lake(Path(lake_dir)), fmt_name)
    return report.read, report.seconds


def pandas_naive(path: Path, fmt_name: str) -> tuple[int, float]:
    import pandas as pd

    from data_contracts import RequestLog
    from models.ingest.formats import DEFAULT_EPOCH

    started = time.perf_counter()
    if fmt_name == "azure":
        raw = pd.read_csv(path)
        frame = pd.DataFrame(
            {
                "timestamp": pd.to_datetime(raw["TIMESTAMP"], utc=True),
                "prompt_tokens": raw["ContextTokens"],
                "output_tokens": raw["GeneratedTokens"],
            }
        )
    else:
        raw = pd.read_json(path, lines=True)
        if fmt_name == "mooncake":
            frame = pd.DataFrame(
                {
                    "timestamp": DEFAULT_EPOCH + pd.to_timedelta(raw["timestamp"], unit="ms"),
                    "prompt_tokens": raw["input_length"],
                    "output_tokens": raw["output_length"],
                    "prefix_hashes": raw["hash_ids"],
                }
            )
        else:
            frame = raw.assign(
                timestamp=pd.to_datetime(raw["timestamp"], utc=True, format="ISO8601")
            )
    defaults = {"tenant": "default", "request_id": [str(i) for i in range(len(frame))],
                "session_id": "s", "prompt": None, "prefix_hashes": None, "template_id": None,
                "route": None, "latency_ms": None, "priority": 5}  # fmt: skip
    for column, value in defaults.items():
        if column not in frame:
            frame[column] = value
    RequestLog.validate(frame[list(RequestLog.to_schema().columns)], lazy=True)
    return len(frame), time.perf_counter() - started


def arrow_parse_only(path: Path, fmt_name: str) -> tuple[int, float]:
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    started = time.perf_counter()
    data = path.read_bytes()
    reader = pacsv.read_csv if fmt_name == "azure" else pajson.read_json
    table = reader(io.BytesIO(data))
    return table.num_rows, time.perf_counter() - started


def best_of(fn, path: Path, fmt_name: str, repeats: int) -> float:
    results = [fn(path, fmt_name) for _ in range(repeats)]
    rows = results[0][0]
    return rate(rows, min(seconds for _, seconds in results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    add_shared_argument(parser)
    args = parser.parse_args()
    pin_to_one_core()
    out: dict[str, object] = {"rows": args.rows, "cores": 1, "inputs": {}}
    with tempfile.TemporaryDirectory() as work:
        inputs = {
            "mooncake": mooncake_file(Path(work) / "mooncake.jsonl", args.rows, args.shared),
            "jsonl": generic_file(Path(work) / "generic.jsonl", args.rows),
            "azure": azure_file(Path(work) / "azure.csv", args.rows, args.shared),
        }
        for name, path in inputs.items():
            print(f"benchmarking {name} ...", file=sys.stderr)
            result = {
                "preheat_validate_rows_per_s": best_of(preheat_validate, path, name, args.repeats),
                "preheat_end_to_end_rows_per_s": best_of(
                    preheat_end_to_end, path, name, args.repeats
                ),
                "pandas_naive_rows_per_s": best_of(pandas_naive, path, name, args.repeats),
                "arrow_parse_only_rows_per_s": best_of(arrow_parse_only, path, name, args.repeats),
            }
            naive = result["pandas_naive_rows_per_s"]
            result["validate_vs_pandas_naive"] = round(
                result["preheat_validate_rows_per_s"] / naive, 2
            )
            result["end_to_end_vs_pandas_naive"] = round(
                result["preheat_end_to_end_rows_per_s"] / naive, 2
            )
            out["inputs"][name] = result
    mooncake = out["inputs"]["mooncake"]["preheat_validate_rows_per_s"]
    out["goal_mooncake_validated_rows_per_s"] = 100_000
    out["goal_met"] = mooncake >= 100_000
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()

"""Hit ratios of the memory tier's policy next to libCacheSim's on the shipped traces.

Runs `preheat bench cache` logic on the Mooncake trace (KV prefix blocks) and, as sanity checks
against published results, on a LIRS and the cache2k web trace; prints one JSON object keyed by
trace. Needs ../shared/data (the traces are read by path, never copied into the project).

Usage: python benchmarks/cache.py [--shared ../shared/data] [--sizes 0.01,0.05,0.1,0.2]
"""

from __future__ import annotations

import argparse
import sys

import orjson

from cache_runtime.traces import load_trace
from models.evaluation.bench.cache_bench import bench_cache
from models.evaluation.bench.shared_data import add_shared_argument

TRACES = (
    ("traces/mooncake_synthetic_trace.jsonl", "mooncake"),
    ("cache_traces/lirs/multi2.trace.gz", "lirs"),
    ("cache_traces/cache2k/web07.trace.xz", "cache2k"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--sizes", default="0.01,0.05,0.1,0.2")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    out = {}
    for relative, fmt in TRACES:
        path = args.shared / relative
        if not path.is_file():
            print(f"skipping {relative}: not found under {args.shared}", file=sys.stderr)
            continue
        print(f"replaying {relative} ...", file=sys.stderr)
        out[path.name] = bench_cache(load_trace(path, fmt), sizes)
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()

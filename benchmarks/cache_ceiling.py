"""What the trace's own signals can close of the LRU-to-Belady gap at most, in hindsight.

Replays the Mooncake trace (KV prefix blocks) through sampled eviction by class-conditioned reuse
probability, with the statistics fitted on the whole trace
(`models.evaluation.bench.signal_ceiling`), with and without conversation turns, next to LRU, Belady
and the shipped policy; prints one JSON object. It bounds what an online policy using these signals
can reach on this trace: the issue's "about a fifth of the gap at 10%" is stated for real
conversation traces. Pass another trace of the same format with --trace. Needs ../shared/data unless
--trace is given.

Usage: python benchmarks/cache_ceiling.py [--shared ../shared/data] [--trace FILE]
       [--sizes 0.01,0.05,0.1,0.2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from cache_runtime.traces import load_trace
from models.evaluation.bench.shared_data import add_shared_argument
from models.evaluation.bench.signal_ceiling import bench_ceiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--trace", type=Path, help="a Mooncake-format trace (default: shipped)")
    parser.add_argument("--sizes", default="0.01,0.05,0.1,0.2")
    args = parser.parse_args()
    path = args.trace or args.shared / "traces" / "mooncake_synthetic_trace.jsonl"
    if not path.is_file():
        sys.exit(f"cache_ceiling: {path} not found: pass --shared or --trace")
    sizes = [float(s) for s in args.sizes.split(",")]
    result = bench_ceiling(load_trace(path, "mooncake"), sizes)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()

"""The memory tier's policies through the real tier on a prefix trace's KV pages, and replayed.

Runs the Mooncake trace's requests, block by block, through a `MemoryTier` under prefix closure
(a page with cached children is never evicted) with each candidate policy alone and with the pool
(`preheat`), next to the same policy's bare replay (`bench cache`'s), at each size; prints one
JSON object (`models.evaluation.bench.tier_bench`). `refused_puts` must be 0: a page refused while
a leaf could go is a policy that gives up under protection. Needs ../shared/data unless --trace
is given.

Usage: python benchmarks/tier_policy.py [--shared ../shared/data] [--trace FILE]
       [--sizes 0.01,0.05,0.1,0.2]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from cache_runtime.traces import TraceError, load_trace
from models.evaluation.bench.cache_bench import parse_sizes
from models.evaluation.bench.shared_data import OneLineParser, add_shared_argument
from models.evaluation.bench.tier_bench import bench_tier


def sizes_of(text: str) -> list[float]:
    """`--sizes`: as `preheat bench cache` reads them."""
    try:
        return parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="tier_policy.py", description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--trace", type=Path, help="a Mooncake-format trace (default: shipped)")
    parser.add_argument("--sizes", type=sizes_of, default=sizes_of("0.01,0.05,0.1,0.2"))
    args = parser.parse_args(argv)
    path = args.trace or args.shared / "traces" / "mooncake_synthetic_trace.jsonl"
    if not path.is_file():
        print(f"tier_policy.py: {path} not found: pass --shared or --trace", file=sys.stderr)
        return 1
    try:
        trace = load_trace(path, "mooncake")
    except TraceError as err:
        print(f"tier_policy.py: {err}", file=sys.stderr)
        return 1
    print(orjson.dumps(bench_tier(trace, args.sizes), option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

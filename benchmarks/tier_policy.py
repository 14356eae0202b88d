"""The memory tier's policies through the real tier on a prefix trace's KV pages, and replayed.

Runs the Mooncake trace's requests, block by block, through a `MemoryTier` under prefix closure
(a page with cached children is never evicted) with each candidate policy alone and with the pool
(`preheat`), next to the same policy's bare replay (`bench cache`'s), at each size; prints one
JSON object (`models.evaluation.bench.tier_bench`). `refused_puts` must be 0: a page refused while
a leaf could go is a policy that gives up under protection. Needs ../shared/data unless --trace
or --lake is given. `--lake DATA_DIR` runs the request log of a data directory instead (`data`
after `make demo`: templated prompts, where LIRS in the tier was LRU until 2026-12-06).

Usage: python benchmarks/tier_policy.py [--shared ../shared/data] [--trace FILE | --lake DIR]
       [--sizes 0.01,0.05,0.1,0.2]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from cache_runtime.traces import AccessTrace, TraceError, load_trace
from models.evaluation.bench.cache_bench import parse_sizes
from models.evaluation.bench.shared_data import OneLineParser, add_shared_argument
from models.evaluation.bench.tier_bench import bench_tier
from models.heat.scheduled_tuning import lake_trace


def sizes_of(text: str) -> list[float]:
    """`--sizes`: as `preheat bench cache` reads them."""
    try:
        return parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="tier_policy.py", description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path, help="a Mooncake-format trace (default: shipped)")
    source.add_argument("--lake", type=Path, help="a data directory whose request log to run")
    parser.add_argument("--sizes", type=sizes_of, default=sizes_of("0.01,0.05,0.1,0.2"))
    args = parser.parse_args(argv)
    try:
        trace = _trace(args.trace, args.lake, args.shared)
    except (FileNotFoundError, TraceError) as err:
        print(f"tier_policy.py: {err}", file=sys.stderr)
        return 1
    print(orjson.dumps(bench_tier(trace, args.sizes), option=orjson.OPT_INDENT_2).decode())
    return 0


def _trace(path: Path | None, lake: Path | None, shared: Path) -> AccessTrace:
    """The trace the flags name: a data directory's request log, a Mooncake-format file, or
    the shipped Mooncake trace."""
    if lake is not None:
        if not lake.is_dir():
            raise FileNotFoundError(f"{lake} is not a directory: pass the data directory")
        return lake_trace(lake)
    path = path or shared / "traces" / "mooncake_synthetic_trace.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass --shared, --trace or --lake")
    return load_trace(path, "mooncake")


if __name__ == "__main__":
    sys.exit(main())

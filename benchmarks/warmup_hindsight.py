"""How much of the restore reference's cut a warm-up plan that knew the future recovers.

Replays the Mooncake trace as `preheat replay --warmup on --latency reference` does (memory 0.05,
SSD 0.2, restarts every 300 s), at each --load, with two more arms beside off, on and the restore
reference: the same worker fed the plan of hindsight (the blocks asked for next, earliest first,
as many as it delivers in time) and that plan among blocks seen before the restart
(`models.evaluation.replay.hindsight`). Prints one JSON object: after-restart TTFT (P95, mean)
of every arm and the share of the reference's cut each warm arm recovers. It tells a plan too
slow to deliver from a plan that does not know which blocks come back first: issue 22's goal is
60% of the cut at P95. Pass another trace of the same format with --trace. Needs ../shared/data
unless --trace is given.

Usage: python benchmarks/warmup_hindsight.py [--shared ../shared/data] [--trace FILE]
       [--loads 1,2] [--memory 0.05] [--ssd 0.2] [--restart-every 300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from cache_runtime.traces import TraceError, load_trace
from models.evaluation.bench.shared_data import add_shared_argument
from models.evaluation.replay.engine import ReplayConfig
from models.evaluation.replay.hindsight import warmup_hindsight
from models.evaluation.replay.latency import REFERENCE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--trace", type=Path, help="a Mooncake-format trace (default: shipped)")
    parser.add_argument("--loads", default="1,2", help="arrival-rate factors, comma-separated")
    parser.add_argument("--memory", type=float, default=0.05)
    parser.add_argument("--ssd", type=float, default=0.2)
    parser.add_argument("--restart-every", type=float, default=300.0)
    args = parser.parse_args()
    path = args.trace or args.shared / "traces" / "mooncake_synthetic_trace.jsonl"
    if not path.is_file():
        sys.exit(f"warmup_hindsight: {path} not found: pass --shared or --trace")
    try:
        loads = [float(load) for load in args.loads.split(",")]
        sizes = {"memory": args.memory, "ssd": args.ssd, "restart_every_s": args.restart_every}
        configs = [ReplayConfig(**sizes, warmup=True, load=load) for load in loads]
        trace = load_trace(path, "mooncake")
    except (ValueError, TraceError) as err:
        sys.exit(f"warmup_hindsight: {err}")
    result = {
        "trace": path.name,
        "memory": args.memory,
        "ssd": args.ssd,
        "restart_every_s": args.restart_every,
        "latency": REFERENCE.source,
        "loads": {str(c.load): warmup_hindsight(trace, c, REFERENCE) for c in configs},
    }
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()

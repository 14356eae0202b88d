"""The memory tier's pool, with any settings, on cells it was not tuned on (issue 21).

`robustness.py` judges the pool on the 44 cells its goals name: every shipped trace at 1, 5, 10
and 20% of its unique blocks. Twenty sessions of changes were chosen on those cells, so a change
is kept only where it also holds on cells it was not chosen on. This script replays the pool
(`PoolPolicy`, its settings given as JSON) beside libCacheSim's policies on three groups and
prints ONE JSON object, a summary per group:

- `command`: the 44 cells of `robustness.py`;
- `heldout`: the same traces at 2, 3, 7 and 15%;
- `generated`: eight synthetic workloads of distinct kinds (`ARCHETYPES`, seeded), at all eight
  sizes: a static Zipf at two skews, a Zipf whose ranks move, one-hit wonders, scans, a loop
  beside a hot set, reuse at short stack distances, working sets in phases. Each favours a
  different family of policies (MQ, LIRS, S3-FIFO, LRU); no setting was chosen on them.

The peers' figures do not depend on the pool's settings: `--peers FILE` keeps them (computed
and written when FILE does not exist, read when it does), so that a sweep over settings replays
only the pool (about 20 s for the 152 cells, against about 9 minutes with the peers). Keep them
when comparing settings: libCacheSim's randomised policies (LeCaR, Cacheus, LHD) differ from run
to run, by up to 0.018 on the generated workloads. Figures: docs/robustness.md.

Usage: python benchmarks/pool_sweep.py [--shared DIR] [--pool '{"min_shadow": 256}']
       [--peers FILE] [--cells]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from cache_runtime.pool import PoolPolicy
from cache_runtime.simulator import replay
from cache_runtime.traces import AccessTrace, TraceError, load_trace
from models.evaluation.bench.cache_bench import MIN_BENCH_CAPACITY, bench_cache
from models.evaluation.bench.shared_data import OneLineParser, add_shared_argument

Json = dict[str, Any]

COMMAND_SIZES = (0.01, 0.05, 0.1, 0.2)  # robustness.py's
HELD_OUT_SIZES = (0.02, 0.03, 0.07, 0.15)
TOLERANCE = 0.003  # the issue's: within 0.003 of the best online policy
SEED = 20261206
ACCESSES = 40_000  # per generated workload: as long as the shipped LIRS traces
# robustness.py's cache traces, named the same way (path under --shared, format)
SHIPPED = (
    ("traces/mooncake_synthetic_trace.jsonl", "mooncake"),
    *(
        (f"cache_traces/lirs/{name}.trace.gz", "lirs")
        for name in ("2_pools", "cpp", "cs", "gli", "multi1", "multi2", "multi3", "ps", "sprite")
    ),
    ("cache_traces/cache2k/web07.trace.xz", "cache2k"),
)


def _zipf(rng: np.random.Generator, n: int, universe: int, alpha: float) -> np.ndarray:
    """(n,) ranks in [0, universe) drawn with probability proportional to rank^-alpha."""
    weights = np.arange(1, universe + 1, dtype=np.float64) ** -alpha
    return rng.choice(universe, size=n, p=weights / weights.sum())


def _shifting(rng: np.random.Generator) -> np.ndarray:
    """A Zipf whose ranks are dealt to new keys every 8,000 accesses."""
    parts = [rng.permutation(10_000)[_zipf(rng, 8_000, 10_000, 0.9)] for _ in range(5)]
    return np.concatenate(parts)


def _one_hit(rng: np.random.Generator) -> np.ndarray:
    """Half the accesses a Zipf, half keys never seen again (S3-FIFO's case)."""
    hot = _zipf(rng, ACCESSES, 5_000, 0.9)
    once = np.arange(1_000_000, 1_000_000 + ACCESSES)
    return np.where(rng.random(ACCESSES) < 0.5, once, hot)


def _scans(rng: np.random.Generator) -> np.ndarray:
    """A Zipf interrupted every 7,000 accesses by a scan of 3,000 new keys."""
    parts = []
    for i in range(4):
        parts += [_zipf(rng, 7_000, 5_000, 0.9), np.arange(3_000) + 2_000_000 + 3_000 * i]
    return np.concatenate(parts)


def _loop_and_hot(rng: np.random.Generator) -> np.ndarray:
    """A loop over 3,000 keys interleaved with a hot set of 500 (LIRS's case)."""
    out = np.empty(ACCESSES, dtype=np.int64)
    out[0::2] = np.arange(ACCESSES // 2) % 3_000 + 3_000_000
    out[1::2] = _zipf(rng, ACCESSES // 2, 500, 1.0)
    return out


def _recency(rng: np.random.Generator) -> np.ndarray:
    """Each access re-reads the key at a geometric stack distance (mean 100) or, one time in
    ten, a new key (LRU's case: the stack distance is all there is)."""
    stack: list[int] = []
    out = np.empty(ACCESSES, dtype=np.int64)
    new = 4_000_000
    for i in range(ACCESSES):
        if not stack or rng.random() < 0.1:
            key, new = new, new + 1
        else:
            key = stack.pop(-min(int(rng.geometric(0.01)), len(stack)))
        stack.append(key)
        out[i] = key
    return out


def _phases(rng: np.random.Generator) -> np.ndarray:
    """Working sets of 2,000 keys in turn, 10,000 accesses each: A, B, A, C."""
    sets = [np.arange(2_000) + 5_000_000 + 10_000 * i for i in range(3)]
    return np.concatenate([sets[j][_zipf(rng, 10_000, 2_000, 0.7)] for j in (0, 1, 0, 2)])


# name -> keys; each workload draws from its own generator, so adding one changes no other
ARCHETYPES: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "zipf_0.8": lambda rng: _zipf(rng, ACCESSES, 10_000, 0.8),
    "zipf_1.1": lambda rng: _zipf(rng, ACCESSES, 10_000, 1.1),
    "zipf_shifting": _shifting,
    "one_hit_wonders": _one_hit,
    "scans": _scans,
    "loop_and_hot": _loop_and_hot,
    "recency": _recency,
    "phases": _phases,
}


def generated(name: str) -> AccessTrace:
    """One archetype as a key-value trace (every access its own request)."""
    keys = ARCHETYPES[name](np.random.default_rng([SEED, list(ARCHETYPES).index(name)]))
    keys = np.asarray(keys, dtype=np.int64)
    return AccessTrace(name, keys, np.arange(len(keys), dtype=np.int64))


# where a trace comes from: (path, format) of a shipped file, or (None, archetype name); plain
# data rather than a loader, so that it can go to a worker process
Source = tuple[str | None, str]


def load(source: Source) -> AccessTrace:
    path, what = source
    return generated(what) if path is None else load_trace(Path(path), what)


def _traces(shared: Path) -> dict[str, tuple[str, Source, tuple[float, ...]]]:
    """Trace name -> (shipped or generated, where it comes from, its sizes). A shipped trace's
    cells are in both `command` and `heldout`; a missing one is left out (listed as skipped)."""
    sizes = tuple(sorted(COMMAND_SIZES + HELD_OUT_SIZES))
    out: dict[str, tuple[str, Source, tuple[float, ...]]] = {}
    for relative, fmt in SHIPPED:
        path = shared / relative
        if path.is_file():
            out[path.name] = ("shipped", (str(path), fmt), sizes)
    for name in ARCHETYPES:
        out[name] = ("generated", (None, name), sizes)
    return out


def peer_rows(trace: AccessTrace, sizes: Sequence[float]) -> Json:
    """size -> the figures of `bench cache` that the pool's settings do not change."""
    usable = [s for s in sizes if round(s * trace.unique) >= MIN_BENCH_CAPACITY]
    rows = bench_cache(trace, usable)["sizes"] if usable else {}
    keep = ("capacity", "best_online", "best_online_policy", "LRU", "Belady")
    return {size: {k: row[k] for k in keep} for size, row in rows.items()}


def _replay_pool(job: tuple[Source, dict[str, int], Json]) -> tuple[Json, float]:
    """(size -> the pool's hit ratio, accesses per second) for one trace, in a worker."""
    source, capacities, settings = job
    trace = load(source)
    hits: Json = {}
    started = time.perf_counter()
    for size, capacity in capacities.items():
        policy = PoolPolicy(capacity=capacity, **settings)
        ratio = replay(policy, trace.accesses, trace.request_starts, capacity).mean()
        hits[size] = round(float(ratio), 4)
    seconds = time.perf_counter() - started
    return hits, len(trace.accesses) * len(capacities) / seconds if seconds else 0.0


def group_of(trace_group: str, size: str) -> str:
    if trace_group == "generated":
        return "generated"
    return "command" if float(size) in COMMAND_SIZES else "heldout"


def summarise(cells: list[Json]) -> Json:
    """A group's cells (each: where, preheat, best_online, LRU) against the issue's goals."""
    margins = [c["preheat"] - c["best_online"] for c in cells]
    worst = min(cells, key=lambda c: c["preheat"] / c["best_online"] if c["best_online"] else 1)
    below = [c for c in cells if c["preheat"] < c["LRU"]]
    return {
        "cells": len(cells),
        "short": sum(m < -TOLERANCE for m in margins),
        "summed_margin_to_best_online": round(sum(margins), 4),
        "worst": {
            "where": worst["where"],
            "ratio_to_best_online": round(worst["preheat"] / worst["best_online"], 4),
        },
        "below_lru": {
            "cells": len(below),
            "summed": round(sum(c["preheat"] - c["LRU"] for c in below), 4),
            "where": [c["where"] for c in below],
        },
    }


def parse(argv: Sequence[str] | None) -> Any:
    parser = OneLineParser(prog="pool_sweep.py", description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--pool", default="{}", help="PoolPolicy's settings as a JSON object")
    parser.add_argument("--peers", type=Path, help="the peers' figures, kept between runs")
    parser.add_argument("--cells", action="store_true", help="print every cell too")
    args = parser.parse_args(argv)
    try:
        args.settings = json.loads(args.pool)
        if not isinstance(args.settings, dict):
            raise ValueError("not a JSON object")
        PoolPolicy(capacity=1024, **args.settings)  # bad names and values fail here, not later
    except (ValueError, TypeError) as err:
        parser.error(f"--pool {args.pool!r}: {err}")
    return args


def _peers(path: Path | None, traces: dict, say: Callable[[str], None]) -> Json:
    """The peers' rows of every trace: read from `path` where it holds them, else computed."""
    known: Json = orjson.loads(path.read_bytes()) if path and path.is_file() else {}
    for name, (_, source, sizes) in traces.items():
        if name not in known:
            say(f"peers: {name}")
            known[name] = peer_rows(load(source), sizes)
            if path:
                path.write_bytes(orjson.dumps(known))
    return known


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    traces = _traces(args.shared)
    try:
        peers = _peers(args.peers, traces, say)
    except (TraceError, OSError, orjson.JSONDecodeError) as err:
        print(f"pool_sweep.py: {err}", file=sys.stderr)
        return 2
    jobs = [
        (source, {s: row["capacity"] for s, row in peers[name].items()}, args.settings)
        for name, (_, source, _) in traces.items()
    ]
    say(f"replaying the pool on {sum(len(j[1]) for j in jobs)} cells")
    with ProcessPoolExecutor(2) as workers:
        replays = dict(zip(traces, workers.map(_replay_pool, jobs), strict=True))
    groups: dict[str, list[Json]] = {"command": [], "heldout": [], "generated": []}
    for name, (trace_group, _, _) in traces.items():
        for size, row in peers[name].items():
            cell = {"where": f"{name} @ {size}", "preheat": replays[name][0][size], **row}
            groups[group_of(trace_group, size)].append(cell)
    out: Json = {
        "pool": args.settings,
        "groups": {g: summarise(cells) for g, cells in groups.items() if cells},
        "slowest_replay_per_s": round(min(rate for _, rate in replays.values())),
        "skipped": [r for r, _ in SHIPPED if not (args.shared / r).is_file()],
    }
    if args.cells:
        out["cells"] = groups
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

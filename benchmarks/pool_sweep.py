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
  beside a hot set, reuse at short stack distances, working sets in phases: between them MQ,
  LIRS, S3-FIFO and LRU each lead somewhere; no setting was chosen on them. A gain there can
  be the luck of one draw: `--seed N` draws the same eight kinds again (a peers file of its
  own: the file keeps one draw per trace name).

The peers' figures do not depend on the pool's settings: `--peers FILE` keeps them (computed
and written for each trace the file does not hold as it is now, read for the others), so that a
sweep over settings replays only the pool (about 20 s for the 152 cells, against about 9 minutes
with the peers). Keep them when comparing settings: libCacheSim's randomised policies (LeCaR,
Cacheus, LHD) differ from run to run, by up to 0.018 on the generated workloads. Figures:
docs/robustness.md.

Usage: python benchmarks/pool_sweep.py [--shared DIR] [--pool '{"min_shadow": 256}']
       [--peers FILE] [--cells] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

# robustness.py's traces and sizes, from the script itself (a script's own directory is first on
# sys.path): a trace added there is swept here too
from robustness import CACHE_TRACES as SHIPPED  # (path under --shared, format)
from robustness import SIZES as COMMAND_SIZES
from robustness_cache import CACHE_TOLERANCE  # the issue's: within 0.003 of the best online

from cache_runtime.pool import PoolPolicy
from cache_runtime.simulator import replay
from cache_runtime.traces import AccessTrace, TraceError, load_trace
from models.evaluation.bench.cache_bench import MIN_BENCH_CAPACITY, bench_cache
from models.evaluation.bench.shared_data import OneLineParser, add_shared_argument

Json = dict[str, Any]

HELD_OUT_SIZES = (0.02, 0.03, 0.07, 0.15)
SEED = 20261206
ACCESSES = 40_000  # per generated workload: as long as the shipped LIRS traces


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


# name -> keys. Each draws from its own generator, seeded by its place here: a workload added at
# the end leaves the others as they were measured (a `--peers` file notices any other change by
# the trace's fingerprint and computes that trace's peers again)
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
SIZES = tuple(sorted(COMMAND_SIZES + HELD_OUT_SIZES))  # every trace's, shipped or generated
PEER_FIELDS = ("capacity", "best_online", "best_online_policy", "LRU", "Belady")


class PeersError(ValueError):
    """A `--peers` file this script cannot use and will not overwrite."""


def generated(name: str, seed: int = SEED) -> AccessTrace:
    """One archetype as a key-value trace (every access its own request); `seed` draws it (the
    shipped one unless `--seed` asks for another draw of the same kinds)."""
    keys = ARCHETYPES[name](np.random.default_rng([seed, list(ARCHETYPES).index(name)]))
    keys = np.asarray(keys, dtype=np.int64)
    return AccessTrace(name, keys, np.arange(len(keys), dtype=np.int64))


def load_traces(shared: Path, seed: int = SEED) -> dict[str, tuple[str, AccessTrace]]:
    """Trace name -> (shipped or generated, the trace). A shipped trace's cells fall in both
    `command` and `heldout`; a missing one is left out (and listed as skipped)."""
    out: dict[str, tuple[str, AccessTrace]] = {}
    for relative, fmt in SHIPPED:
        path = shared / relative
        if path.is_file():
            out[path.name] = ("shipped", load_trace(path, fmt))
    for name in ARCHETYPES:
        out[name] = ("generated", generated(name, seed))
    return out


def fingerprint(trace: AccessTrace) -> int:
    """CRC-32 of the accesses: a kept peers entry is used only for the trace it was made on."""
    return zlib.crc32(trace.accesses.tobytes())


def peer_rows(trace: AccessTrace, sizes: Sequence[float]) -> Json:
    """size -> the figures of `bench cache` that the pool's settings do not change."""
    usable = [s for s in sizes if round(s * trace.unique) >= MIN_BENCH_CAPACITY]
    rows = bench_cache(trace, usable)["sizes"] if usable else {}
    return {size: {k: row[k] for k in PEER_FIELDS} for size, row in rows.items()}


def fits(entry: object, trace: AccessTrace) -> bool:
    """Whether a kept peers entry was made on this trace at these sizes, in this shape."""
    if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint(trace):
        return False
    rows = entry.get("rows")
    return (
        entry.get("sizes") == [str(s) for s in SIZES]
        and isinstance(rows, dict)
        and all(isinstance(r, dict) and set(PEER_FIELDS) <= set(r) for r in rows.values())
    )


def read_peers(path: Path | None) -> Json:
    """The kept entries (none without a file); a file that is not one is refused, not
    overwritten: it may be something else given by mistake."""
    if path is None or not path.is_file():
        return {}
    try:
        known = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as err:
        raise PeersError(f"--peers {path}: not JSON ({err}); remove it to compute again") from None
    if not isinstance(known, dict):
        raise PeersError(f"--peers {path}: not a peers file (a JSON object of traces)")
    return known


def peers_of(
    path: Path | None, traces: dict[str, tuple[str, AccessTrace]], say: Callable[[str], None]
) -> dict[str, Json]:
    """Trace name -> size -> the peers' row: kept where `path` holds this very trace, else
    computed, and written at once (through a temporary file, so an interrupted run leaves the
    previous file whole)."""
    known = read_peers(path)
    for name, (_, trace) in traces.items():
        if fits(known.get(name), trace):
            continue
        say(f"peers: {name}")
        rows = peer_rows(trace, SIZES)
        known[name] = {"fingerprint": fingerprint(trace), "sizes": [str(s) for s in SIZES]}
        known[name]["rows"] = rows
        if path is not None:
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(orjson.dumps(known))
            os.replace(partial, path)
    return {name: known[name]["rows"] for name in traces}


def _replay_pool(job: tuple[AccessTrace, dict[str, int], Json]) -> tuple[Json, float]:
    """(size -> the pool's hit ratio, accesses per second) for one trace, in a worker."""
    trace, capacities, settings = job
    hits: Json = {}
    started = time.perf_counter()
    for size, capacity in capacities.items():
        policy = PoolPolicy(capacity=capacity, **settings)
        ratio = replay(policy, trace.accesses, trace.request_starts, capacity).mean()
        hits[size] = round(float(ratio), 4)
    seconds = time.perf_counter() - started
    return hits, len(trace.accesses) * len(capacities) / seconds if seconds else 0.0


def group_of(trace_group: str, size: str) -> str:
    """A cell's group: `generated` for a generated trace; for a shipped one `command` at the
    sizes `robustness.py` runs, else `heldout`."""
    if trace_group == "generated":
        return "generated"
    return "command" if float(size) in COMMAND_SIZES else "heldout"


def summarise(cells: list[Json]) -> Json:
    """A group's cells (each: where, preheat, best_online, LRU) against the issue's goals; the
    worst ratio over the cells where the best online policy hits at all."""
    margins = [c["preheat"] - c["best_online"] for c in cells]
    rated = [c for c in cells if c["best_online"] > 0]
    worst = min(rated, key=lambda c: c["preheat"] / c["best_online"]) if rated else None
    below = [c for c in cells if c["preheat"] < c["LRU"]]
    return {
        "cells": len(cells),
        "short": sum(m < -CACHE_TOLERANCE for m in margins),
        "summed_margin_to_best_online": round(sum(margins), 4),
        "worst": worst
        and {
            "where": worst["where"],
            "ratio_to_best_online": round(worst["preheat"] / worst["best_online"], 4),
        },
        "below_lru": {
            "cells": len(below),
            "summed": round(sum(c["preheat"] - c["LRU"] for c in below), 4),
            "where": [c["where"] for c in below],
        },
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags; `--pool` is checked by building a pool with it, so a bad name or value is
    one line here rather than a traceback in a worker."""
    parser = OneLineParser(prog="pool_sweep.py", description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--pool", default="{}", help="PoolPolicy's settings as a JSON object")
    parser.add_argument("--peers", type=Path, help="the peers' figures, kept between runs")
    parser.add_argument("--cells", action="store_true", help="print every cell too")
    parser.add_argument(
        "--seed", type=int, default=SEED,
        help=f"draw the generated workloads with this seed (default {SEED}, the figures' own)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        args.settings = json.loads(args.pool)
        if not isinstance(args.settings, dict):
            raise ValueError("not a JSON object")
        PoolPolicy(capacity=1024, **args.settings)  # bad names and values fail here, not later
    except (ValueError, TypeError) as err:
        parser.error(f"--pool {args.pool!r}: {err}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Peers (kept or computed), the pool on every cell in two worker processes, one JSON."""
    args = parse(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        traces = load_traces(args.shared, args.seed)
        peers = peers_of(args.peers, traces, say)
    except (TraceError, PeersError, OSError) as err:
        print(f"pool_sweep.py: {err}", file=sys.stderr)
        return 2
    jobs = [
        (trace, {s: row["capacity"] for s, row in peers[name].items()}, args.settings)
        for name, (_, trace) in traces.items()
    ]
    say(f"replaying the pool on {sum(len(j[1]) for j in jobs)} cells")
    # forked: the workers need this script's `_replay_pool`, which a spawned one cannot import
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as workers:
        replays = dict(zip(traces, workers.map(_replay_pool, jobs), strict=True))
    groups: dict[str, list[Json]] = {"command": [], "heldout": [], "generated": []}
    for name, (trace_group, _) in traces.items():
        for size, row in peers[name].items():
            cell = {"where": f"{name} @ {size}", "preheat": replays[name][0][size], **row}
            groups[group_of(trace_group, size)].append(cell)
    out: Json = {
        "pool": args.settings,
        "seed": args.seed,
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

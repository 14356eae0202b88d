"""Worst case of the project's decisions against their best peer on every shipped trace (issue 21).

An average hides the trace where a decision loses; this script runs the project's own
measurements (`preheat bench cache`, `bench forecast`, `bench hotset`, through the library
functions behind them) on every shipped real trace and series and prints ONE JSON object with
every figure, the worst ratio per family and where it happened, and each goal of issue 21 with
whether it holds. A trace that is missing or unreadable is listed as skipped with the reason;
the run goes on. Needs ../shared/data (read by path, never copied into the project).

Usage: python benchmarks/robustness.py [--shared DIR] [--quick] [--only cache|forecast|hotset]
       [--horizon 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

from cache_runtime.pool import CANDIDATES
from cache_runtime.simulator import replay
from cache_runtime.traces import AccessTrace, TraceError, load_trace
from models.evaluation.bench.cache_bench import MIN_BENCH_CAPACITY, CacheSizeError, bench_cache
from models.evaluation.bench.shared_data import add_shared_argument

Json = dict[str, Any]

LIRS = ("2_pools", "cpp", "cs", "gli", "multi1", "multi2", "multi3", "ps", "sprite")
# (path under --shared, trace format); every shipped cache trace, the LIRS ones by name so that
# a missing one shows up as skipped instead of silently shrinking the worst case
CACHE_TRACES = (
    ("traces/mooncake_synthetic_trace.jsonl", "mooncake"),
    *((f"cache_traces/lirs/{name}.trace.gz", "lirs") for name in LIRS),
    ("cache_traces/cache2k/web07.trace.xz", "cache2k"),
)
QUICK_CACHE_TRACES = (("cache_traces/lirs/multi2.trace.gz", "lirs"),)
SIZES = (0.01, 0.05, 0.1, 0.2)
QUICK_SIZES = (0.05, 0.1)
# (label, path under --shared or DEMO_LOG, format, bucket s, season in buckets): the list
DEMO_LOG = "<generated demo log>"
SERIES = (
    ("azure_code_10s", "traces/azure_llm_code_2023.csv", "azure", 10, None),
    ("azure_code_60s", "traces/azure_llm_code_2023.csv", "azure", 60, None),
    ("servegen_m_mid_600s", "traces/servegen_m_mid_rate_10min.csv", "servegen", 600, 144),
    ("mooncake_10s", "traces/mooncake_synthetic_trace.jsonl", "mooncake", 10, None),
    ("demo_log_300s", DEMO_LOG, "jsonl", 300, 288),  # two generated days, daily season
)
QUICK_SERIES = SERIES[1:2]
HOTSET_TRACE = "traces/mooncake_synthetic_trace.jsonl"  # the one shipped trace with keys + times
HOTSET_WINDOWS = (30.0, 60.0, 120.0)
QUICK_HOTSET_WINDOWS = (60.0,)
HOTSET_K = 50
# the goals: tolerance below the best online policy, forecast ratio, replay speed
CACHE_TOLERANCE = 0.003
MASE_RATIO_GOAL = 1.01
SIGNIFICANT_SERIES_GOAL = 2
REPLAY_GOAL = 200_000
GAP_GOAL = 0.15
FAMILIES = ("cache", "forecast", "hotset")
# what an application really knows (issue 21 part 2), as `bench cache` names its columns once it
# reports them (`preheat_<name>`); the hindsight end is an upper bound and never judged here
CAUSAL_HINTS = ("session_turn", "idle_end", "explicit_close")


class OneLineParser(argparse.ArgumentParser):
    """argparse prints its usage before the error; the benchmark scripts promise one line."""

    def error(self, message: str) -> NoReturn:
        print(f"robustness.py: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags; `--quick` picks a run of a couple of minutes (one LIRS trace, two sizes,
    one series, one hot-set window)."""
    parser = OneLineParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--quick", action="store_true", help="a run of a couple of minutes")
    parser.add_argument("--only", choices=FAMILIES, help="run one family only")
    parser.add_argument("--horizon", type=int, default=1, help="forecast horizon in buckets")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.horizon < 1:
        parser.error("--horizon must be at least 1")
    return args


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _missing(shared: Path, relative: str) -> str | None:
    """Why `relative` cannot be read, or None when it is there."""
    return None if (shared / relative).is_file() else f"not found under {shared}"


def _cache_cell(row: Json, members: dict[str, float]) -> Json:
    """One trace x size: the default policy against the best online peer and LRU, and against
    the best of its own pool's members run alone (`members`, name -> hit ratio)."""
    best = row["best_online"]
    member = max(members, key=members.__getitem__)
    return {
        "preheat": row["preheat"],
        "preheat_no_hints": row["preheat_no_hints"],
        "best_online": best,
        "best_online_policy": row["best_online_policy"],
        "LRU": row["LRU"],
        "Belady": row["Belady"],
        "ratio_to_best_online": round(row["preheat"] / best, 4) if best else None,
        "margin_to_best_online": round(row["preheat"] - best, 4),
        "margin_to_lru": round(row["preheat"] - row["LRU"], 4),
        "gap_closed_vs_lru": row["gap_closed_vs_lru"],
        "causal_hints": {h: row[f"preheat_{h}"] for h in CAUSAL_HINTS if f"preheat_{h}" in row},
        "gap_closed_explicit_close_vs_lru": row.get("gap_closed_explicit_close_vs_lru"),
        "hindsight_gap_closed": row.get(
            "gap_closed_hindsight_end_vs_lru", row.get("gap_closed_app_hints_vs_lru")
        ),
        "best_member": member,
        "best_member_hits": members[member],
        "margin_to_best_member": round(row["preheat"] - members[member], 4),
    }


def pool_members_alone(trace: AccessTrace, capacity: int) -> dict[str, float]:
    """Hit ratio of each candidate of the default pool run alone at `capacity`, with the hints
    its shadow gets (`Candidate.hinted`): what the pool would hit had it followed that one
    from the start. Where the best of them is within tolerance of the best online peer and the
    pool is not, the pool's selection lost the hits, not its choice of candidates."""
    return {
        name: round(
            float(
                replay(
                    candidate.make(), trace.accesses, trace.request_starts, capacity,
                    hints=candidate.hinted,
                ).mean()
            ),
            4,
        )
        for name, candidate in CANDIDATES.items()
    }  # fmt: skip


def cache_trace(path: Path, fmt: str, sizes: Sequence[float]) -> Json:
    """`bench cache` on one trace at the sizes it is big enough for: sizes under libCacheSim's
    minimum capacity are skipped with the reason rather than losing the whole trace."""
    trace = load_trace(path, fmt)
    unique = trace.unique
    usable = [s for s in sizes if round(s * unique) >= MIN_BENCH_CAPACITY]
    skipped = {
        str(s): f"{round(s * unique)} entries, below the minimum {MIN_BENCH_CAPACITY}"
        for s in sizes
        if s not in usable
    }
    out: Json = {"accesses": len(trace.accesses), "unique": unique, "cells": {}}
    if skipped:
        out["skipped_sizes"] = skipped
    if not usable:
        return out
    result = bench_cache(trace, usable, _say)
    out["req_per_s"] = result["req_per_s"]
    out["cells"] = {
        size: _cache_cell(row, pool_members_alone(trace, row["capacity"]))
        for size, row in result["sizes"].items()
    }
    return out


def _guarded(run: Callable[[], Json]) -> Json:
    """A trace that cannot be measured is a skipped entry with its reason, never a traceback."""
    try:
        return run()
    except (TraceError, CacheSizeError, ValueError, OSError) as err:
        return {"skipped": f"{type(err).__name__}: {err}"}


def run_cache(shared: Path, traces: Sequence[tuple[str, str]], sizes: Sequence[float]) -> Json:
    """Every cache trace; the worst default/best-online ratio and the worst margin to LRU."""
    out: Json = {}
    for relative, fmt in traces:
        name = Path(relative).name
        reason = _missing(shared, relative)
        if reason:
            out[name] = {"skipped": reason}
            continue
        _say(f"cache: {name}")
        out[name] = _guarded(lambda r=relative, f=fmt: cache_trace(shared / r, f, sizes))
    return out


def _cache_cells(traces: Json) -> list[tuple[str, Json]]:
    return [
        (f"{name} @ {size}", cell)
        for name, result in traces.items()
        for size, cell in result.get("cells", {}).items()
    ]


def cache_worst(traces: Json) -> Json | None:
    """The cell with the lowest ratio of the default to the best online policy, and the one
    furthest below LRU."""
    cells = [(where, c) for where, c in _cache_cells(traces) if c["ratio_to_best_online"]]
    if not cells:
        return None
    where, cell = min(cells, key=lambda wc: wc[1]["ratio_to_best_online"])
    lru_where, lru_cell = min(cells, key=lambda wc: wc[1]["margin_to_lru"])
    return {
        "ratio_to_best_online": cell["ratio_to_best_online"],
        "where": where,
        "preheat": cell["preheat"],
        "best_online": cell["best_online"],
        "best_online_policy": cell["best_online_policy"],
        "margin_to_lru": lru_cell["margin_to_lru"],
        "margin_to_lru_where": lru_where,
    }


def cache_short_cells(traces: Json) -> Json:
    """The cells more than the tolerance below the best online peer, split by cause: where some
    member of the pool alone is within the tolerance (the selection lost the hits) and where
    none is (the pool lacks a candidate that good)."""
    short = [
        (where, c)
        for where, c in _cache_cells(traces)
        if c["margin_to_best_online"] < -CACHE_TOLERANCE
    ]
    selection = [
        where for where, c in short if c["best_member_hits"] >= c["best_online"] - CACHE_TOLERANCE
    ]
    return {
        "short": len(short),
        "of_cells": len(_cache_cells(traces)),
        "a_member_alone_within_tolerance": selection,
        "no_member_within_tolerance": [where for where, _ in short if where not in selection],
    }


def _forecast_path(shared: Path, relative: str, work: Path) -> Path:
    """The series' file; the demo's log is generated (two days, the demo's own generator)."""
    if relative != DEMO_LOG:
        return shared / relative
    from models.ingest.synthetic import write_synthetic_log

    path = work / "demo_requests.jsonl"
    if not path.is_file():
        _say("forecast: generating the demo's log")
        write_synthetic_log(path)
    return path


def forecast_series(path: Path, fmt: str, bucket: int, season: int | None, args: Any) -> Json:
    """`bench forecast` on one series: preheat's MASE against the best baseline's."""
    from models.evaluation.bench.forecast_bench import bench_forecast

    result = bench_forecast(path, fmt, bucket, args.horizon, season, 0.25, args.seed)
    best = result["best_baseline"]
    return {
        "buckets": result["buckets"],
        "preheat_mase": result["methods"]["preheat"]["MASE"],
        "preheat_chose": result["methods"]["preheat"]["chosen"],
        "attention_mase": result["methods"]["attention"]["MASE"],
        "best_baseline": best,
        "best_baseline_mase": result["methods"][best]["MASE"],
        "mase_ratio": result["preheat_mase_ratio_to_best_baseline"],
        "significantly_lower": result["paired_test"]["significantly_lower"],
        "dm_p_lower": result["paired_test"]["dm_p_lower"],
    }


def run_forecast(shared: Path, series: Sequence[tuple], args: Any) -> Json:
    """Every series at its bucket size; a missing file is skipped with the reason."""
    from models.training import quiet_training

    quiet_training()
    out: Json = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, relative, fmt, bucket, season in series:
            reason = None if relative == DEMO_LOG else _missing(shared, relative)
            if reason:
                out[label] = {"skipped": reason}
                continue
            _say(f"forecast: {label}")
            out[label] = _guarded(
                lambda r=relative, f=fmt, b=bucket, s=season: forecast_series(
                    _forecast_path(shared, r, Path(tmp)), f, b, s, args
                )
            )
    return out


def hotset_window(path: Path, window: float, seed: int) -> Json:
    """`bench hotset` at one window: preheat's recall against the better frequency baseline."""
    from models.evaluation.bench.hotset_bench import bench_hotset

    result = bench_hotset(path, "mooncake", window, HOTSET_K, seed)
    recall = {name: m["recall_of_requests"] for name, m in result["methods"].items()}
    better = max(recall["last_window"], recall["ewma_frequency"])
    return {
        "windows": result["windows"],
        "recall": recall,
        "preheat_chose": result["preheat_chosen"],
        "ratio_to_better_frequency_baseline": round(recall["preheat"] / better, 4)
        if better
        else None,
    }


def run_hotset(shared: Path, windows: Sequence[float], seed: int) -> Json:
    """The hot set of the Mooncake trace at each window."""
    reason = _missing(shared, HOTSET_TRACE)
    out: Json = {}
    for window in windows:
        label = f"mooncake_{window:g}s"
        if reason:
            out[label] = {"skipped": reason}
            continue
        _say(f"hotset: {label}")
        out[label] = _guarded(lambda w=window: hotset_window(shared / HOTSET_TRACE, w, seed))
    return out


def _extreme(results: Json, field: str, worst: Callable) -> Json | None:
    """The entry of `results` whose `field` is worst (`min` or `max`), with its name."""
    measured = {k: v for k, v in results.items() if v.get(field) is not None}
    if not measured:
        return None
    where = worst(measured, key=lambda k: measured[k][field])
    return {field: measured[where][field], "where": where}


def _all(values: list[bool]) -> bool | None:
    """Whether a goal holds over the cells measured; None when nothing was measured."""
    return all(values) if values else None


def _gap_goal(cell: Json | None) -> Json:
    """Mooncake at 10% with the explicit close: share of the LRU-to-Belady gap closed."""
    closed = cell and cell["gap_closed_explicit_close_vs_lru"]
    out: Json = {"holds": None if closed is None else closed >= GAP_GOAL, "goal": GAP_GOAL}
    out["gap_closed_explicit_close"] = closed
    out["gap_closed_no_app_hints"] = cell and cell["gap_closed_vs_lru"]
    if closed is None:
        out["why"] = "not measured: no Mooncake 10% cell, or bench cache has no explicit close"
    return out


def cache_goals(traces: Json) -> Json:
    """The issue's cache goals over every measured cell."""
    cells = [c for _, c in _cache_cells(traces)]
    speeds = [r["req_per_s"] for r in traces.values() if r.get("req_per_s")]
    mooncake = traces.get("mooncake_synthetic_trace.jsonl", {}).get("cells", {}).get("0.1")
    return {
        "cache_within_0.003_of_best_online": _all(
            [c["margin_to_best_online"] >= -CACHE_TOLERANCE for c in cells]
        ),
        "cache_never_below_lru": _all([c["margin_to_lru"] >= 0 for c in cells]),
        "cache_hints_never_lower": _all(
            [c["preheat"] >= c["preheat_no_hints"] for c in cells]
            + [v >= c["preheat"] for c in cells for v in c["causal_hints"].values()]
        ),
        "cache_mooncake_10pct_gap_with_explicit_close": _gap_goal(mooncake),
        "replay_at_least_200k_per_s": {
            "holds": _all([s >= REPLAY_GOAL for s in speeds]),
            "slowest_req_per_s": min(speeds) if speeds else None,
        },
    }


def forecast_goals(series: Json, hotset: Json) -> Json:
    """The issue's forecast and hot-set goals over every measured series and window."""
    ratios = [s["mase_ratio"] for s in series.values() if "mase_ratio" in s]
    significant = sum(bool(s.get("significantly_lower")) for s in series.values())
    recalls = [h["ratio_to_better_frequency_baseline"] for h in hotset.values() if "recall" in h]
    return {
        "forecast_mase_at_most_1.01x_best_baseline": _all([r <= MASE_RATIO_GOAL for r in ratios]),
        "forecast_significantly_below_on_2_series": {
            "holds": significant >= SIGNIFICANT_SERIES_GOAL if ratios else None,
            "series_significantly_lower": significant,
        },
        "hotset_recall_at_least_better_frequency_baseline": _all(
            [r is not None and r >= 1 for r in recalls]
        ),
    }


def summarise(out: Json) -> None:
    """The top-level `worst` and `goals` blocks from the families that ran."""
    cache = out.get("cache", {}).get("traces", {})
    series = out.get("forecast", {}).get("series", {})
    hotset = out.get("hotset", {}).get("windows", {})
    out["worst"] = {
        "cache_ratio_to_best_online": cache_worst(cache) if "cache" in out else None,
        "forecast_mase_ratio": _extreme(series, "mase_ratio", max) if series else None,
        "hotset_recall_ratio": _extreme(hotset, "ratio_to_better_frequency_baseline", min)
        if hotset
        else None,
    }
    out["goals"] = {**cache_goals(cache), **forecast_goals(series, hotset)}
    if "cache" in out:
        out["cache_short_cells"] = cache_short_cells(cache)


def _family_runs(args: argparse.Namespace) -> dict[str, tuple[str, Callable[[], Json]]]:
    """Each family: the key its results go under and the run, full or `--quick`."""
    quick = args.quick
    traces = QUICK_CACHE_TRACES if quick else CACHE_TRACES
    sizes = QUICK_SIZES if quick else SIZES
    series = QUICK_SERIES if quick else SERIES
    windows = QUICK_HOTSET_WINDOWS if quick else HOTSET_WINDOWS
    return {
        "cache": ("traces", lambda: run_cache(args.shared, traces, sizes)),
        "forecast": ("series", lambda: run_forecast(args.shared, series, args)),
        "hotset": ("windows", lambda: run_hotset(args.shared, windows, args.seed)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the chosen families, timing each, and prints the one JSON object."""
    args = parse(argv)
    started = time.perf_counter()
    out: Json = {"shared": str(args.shared), "quick": args.quick, "horizon": args.horizon}
    runs = _family_runs(args)
    for family in [args.only] if args.only else FAMILIES:
        key, run = runs[family]
        part_started = time.perf_counter()
        results = run()
        out[family] = {key: results, "seconds": round(time.perf_counter() - part_started, 1)}
    summarise(out)
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Forecasting goals of issue 4 on the shipped traces, in one run: total series and hot set.

Total series (`preheat bench forecast`): Azure code trace at 10 s, ServeGen at 600 s with a daily
season of 144; the goal is `preheat` MASE at most 1.02 x the best baseline's. Hot set
(`preheat bench hotset`): Mooncake at 60 s windows, K = 50; the goal is a higher
recall_of_requests than both frequency baselines. Prints one JSON object with the ratios. Needs
../shared/data (read by path, never copied into the project).

Usage: python benchmarks/forecast.py [--shared ../shared/data] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys

import orjson

from models.evaluation.bench.forecast_bench import bench_forecast
from models.evaluation.bench.hotset_bench import bench_hotset
from models.evaluation.bench.shared_data import add_shared_argument
from models.training import quiet_training

SERIES = (
    ("traces/azure_llm_code_2023.csv", "azure", 10, None),
    ("traces/servegen_m_mid_rate_10min.csv", "servegen", 600, 144),
)
HOTSET = ("traces/mooncake_synthetic_trace.jsonl", "mooncake", 60.0, 50)


def _series_summary(result: dict) -> dict:
    methods = result["methods"]
    return {
        "preheat_chose": methods["preheat"]["chosen"],
        "preheat_mase": methods["preheat"]["MASE"],
        "best_baseline": result["best_baseline"],
        "best_baseline_mase": methods[result["best_baseline"]]["MASE"],
        "mase_ratio": result["preheat_mase_ratio_to_best_baseline"],
        "goal_met": result["preheat_mase_ratio_to_best_baseline"] <= 1.02,
        "mae_diff_ci95": result["mae_diff_ci95"],
        "full": result,
    }


def _hotset_summary(result: dict) -> dict:
    recall = {name: m["recall_of_requests"] for name, m in result["methods"].items()}
    best_baseline = max(recall["last_window"], recall["ewma_frequency"])
    return {
        "preheat_chose": result["preheat_chosen"],
        "recall": recall,
        "recall_ratio_to_best_frequency_baseline": round(recall["preheat"] / best_baseline, 4),
        "goal_met": recall["preheat"] > best_baseline,
        "full": result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quiet_training()
    out: dict = {}
    for relative, fmt, bucket, season in SERIES:
        path = args.shared / relative
        if not path.is_file():
            print(f"skipping {relative}: not found under {args.shared}", file=sys.stderr)
            continue
        print(f"forecasting {relative} ...", file=sys.stderr)
        result = bench_forecast(path, fmt, bucket, 6, season, 0.25, args.seed)
        out[path.name] = _series_summary(result)
    relative, fmt, window, k = HOTSET
    path = args.shared / relative
    if path.is_file():
        print(f"ranking keys of {relative} ...", file=sys.stderr)
        out[f"{path.name} hotset"] = _hotset_summary(bench_hotset(path, fmt, window, k, args.seed))
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()

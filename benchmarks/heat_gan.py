"""Issue 5's realism goal on the shipped traces: the heat GAN's continuations next to the naive
"repeat the last window + noise" generator's, on held-back windows, in one run.

Series (real per-key or total demand, read by path from ../shared/data, never copied):
- Mooncake: each request's 4-block prefix is a key; the 100 busiest keys at 10 s buckets;
- ServeGen: the total request rate at 10-minute buckets (14 days);
- Azure code: the total request count at 10 s buckets.
Each is turned into heat (decayed counts, half-life 2 buckets), split in time (last 25% held
back), the GAN trained on the first part, and both generators scored on the rest (energy score,
MMD, discriminative score, autocorrelation gap; lower is better for all). Prints one JSON object
with, per series, the numbers and the GAN/naive ratio of each (below 1: the GAN is closer).

Usage: python benchmarks/heat_gan.py [--shared ../shared/data] [--epochs 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from cache_runtime.traces import load_request_keys
from models.evaluation.bench.forecast_bench import total_series
from models.evaluation.bench.shared_data import add_shared_argument
from models.heat.gan import GanConfig, train_gan
from models.heat.realism import NaiveGenerator, compare
from models.heat.series import HeatSplit, decayed_heat
from models.training import quiet_training


def mooncake_keys(path: Path, bucket_s: float = 10.0, top: int = 100) -> np.ndarray:
    """(top, N) requests per key per bucket, busiest keys first."""
    times, keys = load_request_keys(path, "mooncake")
    bucket = ((times - times.min()) // bucket_s).astype(np.int64)
    names, row = np.unique(keys, return_inverse=True)
    counts = np.zeros((len(names), bucket.max() + 1))
    np.add.at(counts, (row, bucket), 1.0)
    return counts[np.argsort(-counts.sum(axis=1), kind="stable")[:top]]


def series(shared: Path) -> dict[str, np.ndarray]:
    traces = shared / "traces"
    return {
        "mooncake_keys_10s": mooncake_keys(traces / "mooncake_synthetic_trace.jsonl"),
        "servegen_total_10min": total_series(
            traces / "servegen_m_mid_rate_10min.csv", "servegen", 600
        )[0][None, :],
        "azure_code_total_10s": total_series(traces / "azure_llm_code_2023.csv", "azure", 10)[0][
            None, :
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not (args.shared / "traces").is_dir():
        sys.exit(f"heat_gan: no traces under {args.shared}: pass --shared")
    quiet_training()
    config = GanConfig(epochs=args.epochs, seed=args.seed)
    out: dict[str, object] = {"config": {"epochs": args.epochs, "seed": args.seed}}
    for name, counts in series(args.shared).items():
        started = time.perf_counter()
        heat = decayed_heat(counts, config.half_life_buckets)
        split = HeatSplit.build(heat, config.history, config.horizon)
        gan = train_gan(split.train.subsample(20_000, args.seed), config)
        naive = NaiveGenerator.fit(split.train)
        realism = compare(
            {"gan": gan.sample, "naive": naive.sample}, split.held_back, seed=args.seed
        )
        numbers = realism["generators"]
        ratios = {
            metric: round(numbers["gan"][metric] / max(numbers["naive"][metric], 1e-12), 4)
            for metric in numbers["gan"]
        }
        out[name] = {
            "keys": counts.shape[0], "buckets": counts.shape[1],
            "train_windows": len(split.train), "held_back_windows": realism["windows"],
            "gan": numbers["gan"], "naive": numbers["naive"], "gan_to_naive": ratios,
            "gan_closer_on": sorted(m for m, r in ratios.items() if r < 1),
            "seconds": round(time.perf_counter() - started, 1),
        }  # fmt: skip
        print(f"{name}: {ratios}", file=sys.stderr)
    sys.stdout.write(orjson.dumps(out).decode() + "\n")


if __name__ == "__main__":
    main()

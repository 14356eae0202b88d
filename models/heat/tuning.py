"""Bayesian tuning of the heat decay: which half-life keeps the right KV pages?

The objective replays a recent window of the trace through the memory tier's `HeatPolicy`
(decayed access frequency, LRFU) at a given half-life, and prices each request with a latency
model: a cached prefix page costs a load, a missed one a prefill. One number, higher is better:

    objective = 1 - mean latency / mean latency with no cache  -  w x max(0, P99 / SLO - 1)

i.e. the share of prefill latency the cache saves, minus a penalty when the P99 misses its SLO.
The search is a Gaussian process with expected improvement (optuna's GPSampler) over
log10(half-life); the default decay is evaluated first, so the result is never worse than it.
A dense grid is run in the same call, to say how close the tuner got and how flat the objective is.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cache_runtime.heat import DAY_S, DecayParams
from cache_runtime.policies import HeatPolicy
from cache_runtime.simulator import prefix_hits, replay

MIN_HALF_LIFE_S = 10.0
MAX_HALF_LIFE_S = 30 * DAY_S


@dataclass(frozen=True)
class LatencyModel:
    """Time to first token from cached and missed 512-token blocks (Mooncake's block size).

    The defaults are orders of magnitude of a 7-8B model on one data-centre GPU: prefill about
    40 ms per 512 tokens, loading a cached block's KV about 2 ms, 20 ms fixed overhead.
    `slo_p99_ms` None means 90% of the no-cache P99: the cache must cut the tail, not only the mean.
    """

    base_ms: float = 20.0
    prefill_ms_per_block: float = 40.0
    load_ms_per_block: float = 2.0
    slo_p99_ms: float | None = None
    slo_weight: float = 1.0


def lambda_per_day(half_life_s: float) -> float:
    return math.log(2) / half_life_s * DAY_S


def evaluate(
    accesses: np.ndarray,
    request_starts: np.ndarray,
    times: np.ndarray,
    capacity: int,
    half_life_s: float,
    model: LatencyModel = LatencyModel(),
) -> dict[str, float]:
    """Replay with `HeatPolicy(half_life_s)`; hit ratios, modelled latency and the objective."""
    hits = replay(
        HeatPolicy(half_life_s), accesses, request_starts, capacity, hints=False, times=times
    )
    usable = prefix_hits(hits, request_starts)
    bounds = np.append(request_starts, len(accesses))
    blocks = np.diff(bounds)  # (R,) blocks per request
    cached = np.add.reduceat(usable.astype(np.int64), request_starts)  # (R,) usable cached blocks
    latency = (
        model.base_ms
        + cached * model.load_ms_per_block
        + (blocks - cached) * model.prefill_ms_per_block
    )
    no_cache = model.base_ms + blocks * model.prefill_ms_per_block
    slo = model.slo_p99_ms or 0.9 * float(np.percentile(no_cache, 99))
    p99 = float(np.percentile(latency, 99))
    objective = 1 - latency.mean() / no_cache.mean() - model.slo_weight * max(0.0, p99 / slo - 1)
    return {
        "half_life_s": round(half_life_s, 3),
        "lambda": round(lambda_per_day(half_life_s), 6),
        "objective": round(float(objective), 6),
        "hit_ratio": round(float(hits.mean()), 4),
        "prefix_hit_ratio": round(float(usable.mean()), 4),
        "mean_ms": round(float(latency.mean()), 2),
        "p99_ms": round(p99, 2),
        "slo_p99_ms": round(slo, 2),
    }


def tune_decay(
    accesses: np.ndarray,
    request_starts: np.ndarray,
    times: np.ndarray,
    capacity: int,
    rounds: int = 10,
    grid_points: int = 40,
    seed: int = 0,
    model: LatencyModel = LatencyModel(),
) -> dict[str, Any]:
    """GP + EI over log10(half-life); returns rounds, best, default and the grid optimum."""
    import optuna

    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    low, high = math.log10(MIN_HALF_LIFE_S), math.log10(MAX_HALF_LIFE_S)
    default_half_life = DecayParams().half_life_s
    cache: dict[float, dict[str, float]] = {}

    def run(half_life_s: float) -> dict[str, float]:
        if half_life_s not in cache:
            cache[half_life_s] = evaluate(
                accesses, request_starts, times, capacity, half_life_s, model
            )
        return cache[half_life_s]

    with warnings.catch_warnings():  # GPSampler is marked experimental since optuna 3.6
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=3)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"log10_half_life_s": math.log10(default_half_life)})
    rounds_out = []

    def objective(trial: optuna.Trial) -> float:
        half_life = 10 ** trial.suggest_float("log10_half_life_s", low, high)
        result = run(half_life)
        rounds_out.append(result)
        return result["objective"]

    study.optimize(objective, n_trials=rounds)
    best = max(rounds_out, key=lambda r: r["objective"])
    grid = [run(float(h)) for h in np.logspace(low, high, grid_points)]
    grid_best = max(grid, key=lambda r: r["objective"])
    objectives = np.array([g["objective"] for g in grid])
    return {
        "rounds": [{"lambda": r["lambda"], "objective": r["objective"]} for r in rounds_out],
        "best": best,
        "default": run(default_half_life),
        "grid_optimum": grid_best,
        "within_2pct_of_grid": bool(
            best["objective"] >= grid_best["objective"] - 0.02 * abs(grid_best["objective"])
        ),
        "objective_range_over_grid": round(float(objectives.max() - objectives.min()), 6),
        "latency_model": asdict(model),
        "capacity": capacity,
    }

"""Bayesian tuning of the heat decay: which half-life (and priority weight) keeps the right pages?

The objective replays a recent window of the trace through the memory tier's `HeatPolicy`
(decayed access frequency, LRFU) at a given half-life and priority weight, and prices each
request with a latency model: a cached prefix page costs a load, a missed one a prefill. One
number, higher is better. Requests matter by their priority p_r (1..10):

    objective = 1 - sum_r p_r L_r / sum_r p_r L0_r  -  s x max(0, P99(L over T) / SLO - 1)

L_r is request r's modelled latency, L0_r its latency with no cache, s the SLO weight, and T the
requests of priority >= `LatencyModel.slo_priority` (8) when the window has any, else all of
them; the default SLO is 90% of the no-cache P99 over the same T. That is the priority-weighted
share of prefill latency the cache saves, minus a penalty when the tail that matters misses its
SLO. When every request has the same priority (Mooncake traces carry none: all count as 5) the
weights cancel and T is every request, and the code takes the unweighted path, so the objective
is exactly 1 - mean L / mean L0 - s x max(0, P99(L) / SLO - 1), as before priorities existed.

The priority weight w makes an access of priority p add (p / 10) ** w heat instead of 1 (w = 0:
priority ignored; w = 1: the coupled heat's linear priority). The search is a Gaussian process
with expected improvement (optuna's GPSampler) over log10(half-life) and, when the window holds
more than one priority, w in [0, 2]; with one priority w has no effect and is not searched. The
default (half-life of lambda = 0.5/day, w = 1) is evaluated first, so the result is never worse
than it. A dense grid (half-lives x 5 weights) is run in the same call, to say how close the
tuner got and how flat the objective is.
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
MAX_PRIORITY_WEIGHT = 2.0
GRID_PRIORITY_WEIGHTS = 5  # weights on the comparison grid: 0, 0.5, ..., MAX_PRIORITY_WEIGHT


@dataclass(frozen=True)
class LatencyModel:
    """Time to first token from cached and missed 512-token blocks (Mooncake's block size).

    The defaults are orders of magnitude of a 7-8B model on one data-centre GPU: prefill about
    40 ms per 512 tokens, loading a cached block's KV about 2 ms, 20 ms fixed overhead.
    `slo_p99_ms` None means 90% of the no-cache P99: the cache must cut the tail, not only the mean.
    The P99 and its SLO are over the requests of priority >= `slo_priority` when there are any.
    """

    base_ms: float = 20.0
    prefill_ms_per_block: float = 40.0
    load_ms_per_block: float = 2.0
    slo_p99_ms: float | None = None
    slo_weight: float = 1.0
    slo_priority: int = 8


def lambda_per_day(half_life_s: float) -> float:
    return math.log(2) / half_life_s * DAY_S


def varies(priorities: np.ndarray | None) -> bool:
    """Whether the priorities can make a difference: more than one distinct value."""
    return priorities is not None and len(priorities) > 0 and bool(np.ptp(priorities) > 0)


def evaluate(
    accesses: np.ndarray,
    request_starts: np.ndarray,
    times: np.ndarray,
    capacity: int,
    half_life_s: float,
    model: LatencyModel = LatencyModel(),
    priorities: np.ndarray | None = None,
    priority_weight: float = 1.0,
) -> dict[str, Any]:
    """Replay with `HeatPolicy(half_life_s, priority_weight)`; hit ratios, modelled latency and
    the objective (module docstring). `priorities`: (N,) 1..10 per access, or None. When they
    do not vary, neither the policy nor the objective sees them and the result says
    `priority_weight: None` (it had no effect)."""
    priorities = _checked_priorities(priorities, accesses.shape)
    weighted = varies(priorities)
    hits = replay(
        HeatPolicy(half_life_s, priority_weight),
        accesses,
        request_starts,
        capacity,
        hints=False,
        times=times,
        priorities=priorities if weighted else None,
    )
    usable = prefix_hits(hits, request_starts)
    latency, no_cache = _request_latencies(usable, request_starts, len(accesses), model)
    if weighted:
        assert priorities is not None
        ratio, tail, tail_free = _weighted(latency, no_cache, priorities[request_starts], model)
    else:  # equal weights cancel: the unweighted form, bit for bit as before priorities
        ratio = latency.mean() / no_cache.mean()
        tail, tail_free = latency, no_cache
    slo = model.slo_p99_ms or 0.9 * float(np.percentile(tail_free, 99))
    p99 = float(np.percentile(tail, 99))
    objective = 1 - ratio - model.slo_weight * max(0.0, p99 / slo - 1)
    return {
        "half_life_s": round(half_life_s, 3),
        "lambda": round(lambda_per_day(half_life_s), 6),
        "priority_weight": round(float(priority_weight), 4) if weighted else None,
        "objective": round(float(objective), 6),
        "hit_ratio": round(float(hits.mean()), 4),
        "prefix_hit_ratio": round(float(usable.mean()), 4),
        "mean_ms": round(float(latency.mean()), 2),
        "p99_ms": round(p99, 2),
        "slo_p99_ms": round(slo, 2),
        "p99_requests": len(tail),
    }


def _checked_priorities(priorities: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """`priorities` as an array of the accesses' `shape`, each in 1..10 (ValueError if not)."""
    if priorities is not None:
        priorities = np.asarray(priorities)
        if priorities.shape != shape:
            raise ValueError(f"priorities must have shape {shape}")
        if np.any((priorities < 1) | (priorities > 10)):
            raise ValueError("priorities must be in 1..10")
    return priorities


def _request_latencies(
    usable: np.ndarray, request_starts: np.ndarray, accesses: int, model: LatencyModel
) -> tuple[np.ndarray, np.ndarray]:
    """(R,) modelled latency of each request with the cache (`usable`: (N,) the prefix hits)
    and without it."""
    bounds = np.append(request_starts, accesses)
    blocks = np.diff(bounds)  # (R,) blocks per request
    cached = np.add.reduceat(usable.astype(np.int64), request_starts)  # (R,) usable cached blocks
    latency = (
        model.base_ms
        + cached * model.load_ms_per_block
        + (blocks - cached) * model.prefill_ms_per_block
    )
    no_cache = model.base_ms + blocks * model.prefill_ms_per_block
    return latency, no_cache


def _weighted(
    latency: np.ndarray, no_cache: np.ndarray, first_priorities: np.ndarray, model: LatencyModel
) -> tuple[float, np.ndarray, np.ndarray]:
    """(priority-weighted latency ratio, the tail's latencies with and without the cache) when
    priorities vary; `first_priorities`: (R,) each request's, from its first access. The tail is
    the requests of priority >= `model.slo_priority`, or all of them when there are none."""
    priority = first_priorities.astype(np.float64)  # (R,) each request's
    ratio = float(priority @ latency) / float(priority @ no_cache)
    high = priority >= model.slo_priority
    tail, tail_free = (latency[high], no_cache[high]) if high.any() else (latency, no_cache)
    return ratio, tail, tail_free


class _Evaluations:
    """`evaluate` on one window at (half-life, priority weight), memoised: the grid, the rounds
    and the default share points."""

    def __init__(
        self,
        accesses: np.ndarray,
        request_starts: np.ndarray,
        times: np.ndarray,
        capacity: int,
        model: LatencyModel,
        priorities: np.ndarray | None,
    ) -> None:
        self._window = (accesses, request_starts, times, capacity)
        self._model = model
        self._priorities = priorities
        self._cache: dict[tuple[float, float], dict[str, Any]] = {}

    def __call__(self, half_life_s: float, weight: float) -> dict[str, Any]:
        if (half_life_s, weight) not in self._cache:
            self._cache[half_life_s, weight] = evaluate(
                *self._window, half_life_s, self._model, self._priorities, weight
            )
        return self._cache[half_life_s, weight]


def tune_decay(
    accesses: np.ndarray,
    request_starts: np.ndarray,
    times: np.ndarray,
    capacity: int,
    rounds: int = 10,
    grid_points: int = 40,
    seed: int = 0,
    model: LatencyModel = LatencyModel(),
    priorities: np.ndarray | None = None,
) -> dict[str, Any]:
    """GP + EI over log10(half-life), and the priority weight when `priorities` (N,) vary;
    returns rounds, best, default and the grid optimum, each with its lambda, priority weight
    (None when not searched) and objective."""
    import optuna

    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    low, high = math.log10(MIN_HALF_LIFE_S), math.log10(MAX_HALF_LIFE_S)
    default = DecayParams()
    joint = varies(priorities)
    run = _Evaluations(
        accesses, request_starts, times, capacity, model, priorities if joint else None
    )
    rounds_out = _search(run, rounds, seed, (low, high), joint, default)
    best = max(rounds_out, key=lambda r: r["objective"])
    grid, weights = _grid(run, (low, high), grid_points, joint, default)
    grid_best = max(grid, key=lambda r: r["objective"])
    objectives = np.array([g["objective"] for g in grid])
    return {
        "rounds": [
            {
                "lambda": r["lambda"],
                "priority_weight": r["priority_weight"],
                "objective": r["objective"],
            }
            for r in rounds_out
        ],
        "best": best,
        "default": run(default.half_life_s, default.priority_weight),
        "grid_optimum": grid_best,
        "priority_weight": best["priority_weight"],
        "priority_weight_note": _weight_note(joint, priorities),
        "within_2pct_of_grid": bool(
            best["objective"] >= grid_best["objective"] - 0.02 * abs(grid_best["objective"])
        ),
        "objective_range_over_grid": round(float(objectives.max() - objectives.min()), 6),
        "grid_shape": [grid_points, len(weights)],
        "latency_model": asdict(model),
        "capacity": capacity,
    }


def _search(
    run: _Evaluations,
    rounds: int,
    seed: int,
    log10_range: tuple[float, float],
    joint: bool,
    default: DecayParams,
) -> list[dict[str, Any]]:
    """The Bayesian rounds (GP + EI), the default first: each round's `evaluate` result."""
    import optuna

    low, high = log10_range
    with warnings.catch_warnings():  # GPSampler is marked experimental since optuna 3.6
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=3)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    first: dict[str, float] = {"log10_half_life_s": math.log10(default.half_life_s)}
    if joint:
        first["priority_weight"] = default.priority_weight
    study.enqueue_trial(first)
    rounds_out = []

    def objective(trial: optuna.Trial) -> float:
        half_life = 10 ** trial.suggest_float("log10_half_life_s", low, high)
        weight = default.priority_weight
        if joint:
            weight = trial.suggest_float("priority_weight", 0.0, MAX_PRIORITY_WEIGHT)
        result = run(half_life, weight)
        rounds_out.append(result)
        return result["objective"]

    study.optimize(objective, n_trials=rounds)
    return rounds_out


def _grid(
    run: _Evaluations,
    log10_range: tuple[float, float],
    grid_points: int,
    joint: bool,
    default: DecayParams,
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """(results, weights) of the dense comparison grid: `grid_points` half-lives, log-spaced,
    times the weights (`GRID_PRIORITY_WEIGHTS` of them when searched, else the default's)."""
    low, high = log10_range
    weights = (
        np.linspace(0.0, MAX_PRIORITY_WEIGHT, GRID_PRIORITY_WEIGHTS)
        if joint
        else np.array([default.priority_weight])
    )
    grid = [run(float(h), float(w)) for h in np.logspace(low, high, grid_points) for w in weights]
    return grid, weights


def _weight_note(joint: bool, priorities: np.ndarray | None) -> str:
    """Why the priority weight was searched, or why not."""
    if joint:
        return (
            f"searched with the half-life over [0, {MAX_PRIORITY_WEIGHT}]: an access of "
            "priority p adds (p / 10) ** w heat"
        )
    which = "carry no priority" if priorities is None else "have the same priority"
    return f"not searched: the window's requests {which}, so the weight has no effect here"

"""Rolling-origin evaluation of forecasters on one chronological train/test split.

The series is cut once: everything before `split` is train, the rest is test. Methods are fitted
on the train part only, MASE is scaled by the train part only, and then each method forecasts
from every origin in the test part whose whole horizon stays inside the test part. Forecasts see
the whole series but may use only `series[:origin]` (the leakage tests hold every forecaster to
that), which is what a deployed forecaster sees when it is asked at time `origin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from models.forecast.base import Forecaster
from models.forecast.metrics import block_bootstrap_ci, naive_scale, smape


def chronological_split(n: int, test_frac: float, min_train: int = 2) -> int:
    """Index of the first test bucket: the last `test_frac` of n buckets (at least 1) are test.

    `min_train` defaults to 2, the fewest points that give MASE a scale.
    """
    if not 0 < test_frac < 1:
        raise ValueError(f"test_frac must be in (0, 1), got {test_frac}")
    split = n - max(1, round(n * test_frac))
    if split < min_train:
        raise ValueError(
            f"{n} buckets at test_frac={test_frac} leave {split} train, need {min_train}"
        )
    return split


def rolling_origins(split: int, n: int, horizon: int, step: int = 1) -> np.ndarray:
    """Origins o in [split, n - horizon], every `step`: each target series[o:o+horizon] is test."""
    if horizon < 1 or step < 1:
        raise ValueError(f"horizon and step must be >= 1, got horizon={horizon}, step={step}")
    if not 0 <= split <= n - horizon:
        raise ValueError(f"no origin fits: split={split}, n={n}, horizon={horizon}")
    return np.arange(split, n - horizon + 1, step, dtype=np.int64)


def origin_targets(series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    """What came in the `horizon` buckets from each origin: (N, H) of a (T,) series, (N, K, H)
    of a (K, T) panel."""
    window = np.asarray(origins, dtype=np.int64)[:, None] + np.arange(horizon)[None, :]  # (N, H)
    return np.moveaxis(series[..., window], -2, 0)


@dataclass(frozen=True, eq=False)
class MethodScore:
    """One method's test-part scores; `origin_errors` (n_origins,) is the MAE over the horizon
    at each origin, in time order, kept for the paired block bootstrap."""

    name: str
    mae: float
    smape: float
    mase: float
    origin_errors: np.ndarray


@dataclass(frozen=True, eq=False)
class Evaluation:
    """All methods scored at the same origins; `scale` is the train part's naive MAE."""

    split: int
    horizon: int
    origins: np.ndarray
    scale: float
    scores: dict[str, MethodScore]

    def summary(self) -> dict[str, dict[str, float]]:
        """{method: {"mae", "smape", "mase"}}, ready to log or print."""
        return {
            name: {"mae": s.mae, "smape": s.smape, "mase": s.mase}
            for name, s in self.scores.items()
        }


@dataclass(frozen=True)
class Comparison:
    """A method against the best baseline; `mae_diff` < 0 means the method has the lower MAE."""

    method: str
    best_baseline: str
    method_mase: float
    baseline_mase: float
    mae_diff: float
    mae_diff_ci95: tuple[float, float]


def _score(name: str, targets: np.ndarray, pred: np.ndarray, scale: float) -> MethodScore:
    if pred.shape != targets.shape:
        raise ValueError(f"{name} returned forecasts of shape {pred.shape}, want {targets.shape}")
    abs_err = np.abs(targets - pred)  # (N, H)
    err = float(abs_err.mean())
    return MethodScore(name, err, smape(targets, pred), err / scale, abs_err.mean(axis=1))


def evaluate(
    methods: Mapping[str, Forecaster],
    series: np.ndarray,
    split: int,
    horizon: int,
    *,
    step: int = 1,
    prefitted: bool = False,
) -> Evaluation:
    """Fit each method on series[:split], then score its forecasts at every rolling origin.

    Args:
        methods: {name: forecaster}; the name keys the results.
        series: (T,) finite demand counts.
        split: first test index (see `chronological_split`).
        horizon: steps forecast from each origin.
        step: spacing of the origins.
        prefitted: skip `fit` because the caller fitted the methods already -- on train data
            only, which this function cannot check; the default fits here so it is guaranteed.

    Each method gets its own copy of the train part (not a view, whose `.base` is the whole
    series) and its own copy of the series, so one method can neither peek at the test part while
    fitting nor corrupt what the next method sees.
    """
    y = np.asarray(series, dtype=np.float64)
    if y.ndim != 1 or not np.all(np.isfinite(y)):
        raise ValueError("series must be a 1-D array of finite values")
    origins = rolling_origins(split, y.size, horizon, step)
    train = y[:split].copy()
    scale = naive_scale(train)
    targets = origin_targets(y, origins, horizon)  # (N, H)
    scores = {}
    for name, method in methods.items():
        if not prefitted:
            method.fit(train.copy())
        pred = np.asarray(method.forecast(y.copy(), origins, horizon), dtype=np.float64)
        scores[name] = _score(name, targets, pred, scale)
    return Evaluation(split, horizon, origins, scale, scores)


def best_baseline(evaluation: Evaluation, baselines: Iterable[str]) -> str:
    """The baseline with the lowest MASE (ties: the first named)."""
    names = list(baselines)
    if not names:
        raise ValueError("no baselines to choose from")
    missing = [b for b in names if b not in evaluation.scores]
    if missing:
        raise ValueError(f"baselines not in the evaluation: {missing}")
    return min(names, key=lambda b: evaluation.scores[b].mase)


def compare_to_best_baseline(
    evaluation: Evaluation,
    method: str,
    baselines: Iterable[str] | None = None,
    *,
    block: int | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> Comparison:
    """`method` minus the best baseline by MASE, with a block-bootstrap 95% interval of the MAE gap.

    The best baseline is chosen on the test part. That selects the opponent, fits nothing, and
    picking the strongest baseline after the fact only makes the method's win harder: the
    comparison errs toward "no improvement", which is the safe direction.

    Args:
        evaluation: from `evaluate`, with `method` and the baselines scored at the same origins.
        method: the name of the method under test.
        baselines: names to choose from; default every other method in the evaluation.
        block, n_boot, seed: passed to `block_bootstrap_ci`.
    """
    if method not in evaluation.scores:
        raise ValueError(f"method {method!r} is not in the evaluation")
    names = [n for n in evaluation.scores if n != method] if baselines is None else baselines
    best = best_baseline(evaluation, names)
    a, b = evaluation.scores[method], evaluation.scores[best]
    ci = block_bootstrap_ci(a.origin_errors, b.origin_errors, block, n_boot, seed, 0.95)
    # Every origin covers `horizon` targets, so the mean per-origin gap is exactly the MAE gap.
    diff = float(np.mean(a.origin_errors - b.origin_errors))
    return Comparison(method, best, a.mase, b.mase, diff, ci)

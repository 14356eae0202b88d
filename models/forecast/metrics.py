"""Point-forecast errors and a paired bootstrap interval for comparing two forecasters.

Demand counts are bursty and often zero, so each metric is chosen for that: MAE in the series'
own units; sMAPE bounded to 0..200 with 0/0 terms defined as 0 (plain MAPE divides by zero on
every idle bucket); MASE scaled by the train part's lag-1 naive MAE, so it compares across series
of different volume and never looks at the test part for its scale.
"""

from __future__ import annotations

import math

import numpy as np


def _pair(actual: np.ndarray, predicted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(actual, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if a.shape != p.shape:
        raise ValueError(f"actual {a.shape} and predicted {p.shape} must have the same shape")
    if a.size == 0:
        raise ValueError("actual and predicted are empty")
    return a, p


def mae(actual: np.ndarray, predicted: np.ndarray) -> float:
    """Mean absolute error over all elements of matching arrays of any shape."""
    a, p = _pair(actual, predicted)
    return float(np.mean(np.abs(a - p)))


def smape(actual: np.ndarray, predicted: np.ndarray) -> float:
    """Symmetric MAPE in percent, 0..200: mean of 200 |a - p| / (|a| + |p|).

    A term with a == p == 0 counts as 0 (a perfect forecast of an idle bucket), not NaN; dropping
    those terms instead would reward a model for the buckets it was not scored on.
    """
    a, p = _pair(actual, predicted)
    denom = np.abs(a) + np.abs(p)
    ratio = np.divide(2.0 * np.abs(a - p), denom, out=np.zeros(a.shape), where=denom > 0)
    return float(100.0 * np.mean(ratio))


def naive_scale(train: np.ndarray) -> float:
    """In-sample lag-1 naive MAE of the train part: MASE's denominator.

    Raises:
        ValueError: the train part has fewer than 2 points or is constant (the scale is 0, so
            every MASE would be infinite or undefined).
    """
    y = np.asarray(train, dtype=np.float64)
    if y.ndim != 1 or y.size < 2:
        raise ValueError(f"MASE needs a 1-D train part of at least 2 points, got shape {y.shape}")
    scale = float(np.mean(np.abs(np.diff(y))))
    if not scale > 0:
        raise ValueError(
            "MASE is undefined: the train part's lag-1 naive MAE is 0 (constant train series)"
        )
    return scale


def mase(actual: np.ndarray, predicted: np.ndarray, train: np.ndarray) -> float:
    """MAE divided by the train part's lag-1 naive MAE (< 1: better than naive was in-sample)."""
    return mae(actual, predicted) / naive_scale(train)


def block_bootstrap_ci(
    errors_a: np.ndarray,
    errors_b: np.ndarray,
    block: int | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Moving-block bootstrap percentile interval of mean(errors_a - errors_b).

    The inputs are per-origin errors in time order. Consecutive origins share most of their target
    buckets, so their errors are autocorrelated and an iid bootstrap would give intervals too
    narrow; resampling contiguous blocks keeps that dependence. Pairing (one difference per
    origin) removes the variance both methods share from the bursts themselves.

    Args:
        errors_a: (n,) per-origin errors of method a, in time order.
        errors_b: (n,) per-origin errors of method b at the same origins.
        block: block length; default round(n ** (1/3)), at least 1, at most n.
        n_boot: bootstrap resamples.
        seed: seed of the generator; the same seed gives the same interval.
        level: coverage of the interval, in (0, 1).

    Returns:
        (lo, hi); an interval below 0 means a is better (lower error) than b.
    """
    a = np.asarray(errors_a, dtype=np.float64)
    b = np.asarray(errors_b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(
            f"errors must be two non-empty 1-D arrays of one length: {a.shape} {b.shape}"
        )
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    diff = a - b
    n = diff.size
    size = max(1, round(n ** (1 / 3))) if block is None else int(block)
    if size < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    size = min(size, n)
    n_blocks = math.ceil(n / size)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n - size + 1, size=(n_boot, n_blocks))
    idx = (starts[:, :, None] + np.arange(size)).reshape(n_boot, -1)[:, :n]  # (B, n)
    means = diff[idx].mean(axis=1)
    tail = (1 - level) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return float(lo), float(hi)


def diebold_mariano(
    errors_a: np.ndarray, errors_b: np.ndarray, horizon: int = 1
) -> tuple[float, float, float]:
    """Paired test over origins that a's mean error differs from b's: (statistic, p two-sided,
    p one-sided that a is lower).

    Diebold & Mariano (1995) on the per-origin differences d = a - b, with a Bartlett (Newey-
    West) long-run variance and the small-sample correction and Student t of Harvey, Leybourne &
    Newbold (1997). The lag is the larger of horizon - 1 (overlapping targets) and n^(1/3):
    errors of bursty demand stay correlated even one step ahead, and too short a lag would
    make a small gap look significant. A statistic below 0 means a has the lower error.
    """
    from scipy import stats

    d = np.asarray(errors_a, dtype=np.float64) - np.asarray(errors_b, dtype=np.float64)
    n = d.size
    if d.ndim != 1 or n < 3 or not np.all(np.isfinite(d)):
        raise ValueError(f"need at least 3 finite paired errors, got shape {d.shape}")
    lag = min(n - 1, max(horizon - 1, round(n ** (1 / 3))))
    centred = d - d.mean()
    var = centred @ centred / n
    for k in range(1, lag + 1):
        var += 2 * (1 - k / (lag + 1)) * (centred[k:] @ centred[:-k]) / n
    if not np.any(d):
        return 0.0, 1.0, 0.5  # the same errors everywhere: nothing to test
    var = max(var, 1e-12 * float(d @ d) / n)  # a constant gap: no spread, the sign is certain
    h = max(1, horizon)
    correction = math.sqrt(max((n + 1 - 2 * h + h * (h - 1) / n) / n, 1e-12))
    stat = correction * d.mean() / math.sqrt(var / n)
    return float(stat), float(2 * stats.t.sf(abs(stat), n - 1)), float(stats.t.cdf(stat, n - 1))

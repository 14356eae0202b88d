"""Baseline forecasters of a demand series: the bar any learned model has to clear.

Every baseline answers all origins in one vectorised call. It gathers what it needs with index
arithmetic (`origin - 1 - lag`), so the row of an origin reads only `series[:origin]` by
construction, and rolling-origin evaluation over hundreds of origins takes milliseconds. A loop
over origins was rejected: it is what makes leakage easy (one `series[o]` typo) and slow.

An origin too early for a method (fewer than `window`, `season` or `p` points before it) falls
back to what exists: the last value, or the mean so far. An origin with no history at all
forecasts 0 (no demand seen yet) rather than the train mean, which would reach past the origin.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models.forecast.base import Forecaster

DEFAULT_ALPHAS = np.round(np.linspace(0.02, 1.0, 50), 2)


def _as_series(series: np.ndarray, what: str) -> np.ndarray:
    y = np.asarray(series, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"{what} must be a non-empty 1-D array, got shape {y.shape}")
    return y


def _train_part(train: np.ndarray) -> np.ndarray:
    y = _as_series(train, "train")
    if not np.all(np.isfinite(y)):
        raise ValueError("train contains NaN or inf")
    return y


def _check_args(
    series: np.ndarray, origins: np.ndarray, horizon: int
) -> tuple[np.ndarray, np.ndarray]:
    # The series itself is not checked for finiteness: values at or after an origin are none of
    # the forecaster's business, and the leakage test fills them with NaN on purpose.
    y = _as_series(series, "series")
    o = np.asarray(origins)
    if o.size == 0:
        o = np.zeros(0, dtype=np.int64)
    if o.ndim != 1 or not np.issubdtype(o.dtype, np.integer):
        raise ValueError(f"origins must be a 1-D integer array, got {o.dtype} {o.shape}")
    if o.size and (o.min() < 0 or o.max() > y.size):
        raise ValueError(f"origins must lie in [0, {y.size}], got [{o.min()}, {o.max()}]")
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    return y, o.astype(np.int64)


def _gather(y: np.ndarray, idx: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """y[idx] where idx >= 0, else `fill` (broadcast); never reads a negative index."""
    return np.where(idx >= 0, y[np.clip(idx, 0, None)], fill)


def _last_values(y: np.ndarray, o: np.ndarray) -> np.ndarray:
    """(N,) y[o - 1], or 0 where the origin has no history."""
    return _gather(y, o - 1, 0.0)


def _prefix_means(y: np.ndarray, o: np.ndarray) -> np.ndarray:
    """(N,) mean of y[:o], or 0 where o == 0 (cumsum is sequential, so causal)."""
    if o.size == 0:
        return np.zeros(0)
    sums = np.concatenate(([0.0], np.cumsum(y[: o.max()])))
    return np.divide(sums[o], o, out=np.zeros(o.size), where=o > 0)


def _flat(level: np.ndarray, horizon: int) -> np.ndarray:
    """(N,) -> (N, horizon) level repeated, clipped at 0."""
    return np.repeat(np.maximum(level, 0.0)[:, None], horizon, axis=1)


class Naive:
    """The last observed value, repeated: unbeatable on a random walk, the MASE yardstick."""

    name = "naive"

    def fit(self, train: np.ndarray) -> Naive:
        _train_part(train)
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        y, o = _check_args(series, origins, horizon)
        return _flat(_last_values(y, o), horizon)


class SeasonalNaive:
    """The value one season before each target step, from the last season seen before the origin.

    Target `o + h` takes `y[o + h - season * k]` with the smallest k >= 1 that lands before the
    origin, i.e. index `o - season + (h mod season)`; a horizon longer than the season repeats the
    last observed season. Before one full season exists it falls back to the last value.
    """

    name = "seasonal_naive"

    def __init__(self, season: int) -> None:
        if int(season) < 1:
            raise ValueError(f"season must be >= 1, got {season}")
        self.season = int(season)

    def fit(self, train: np.ndarray) -> SeasonalNaive:
        _train_part(train)
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        y, o = _check_args(series, origins, horizon)
        steps = np.arange(horizon) % self.season
        idx = o[:, None] - self.season + steps[None, :]  # (N, H), all < o
        vals = _gather(y, idx, _last_values(y, o)[:, None])
        return np.maximum(vals, 0.0)


class MovingAverage:
    """Mean of the last `window` values, repeated; mean of what exists before that many."""

    name = "moving_average"

    def __init__(self, window: int = 5) -> None:
        if int(window) < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = int(window)

    def fit(self, train: np.ndarray) -> MovingAverage:
        _train_part(train)
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        y, o = _check_args(series, origins, horizon)
        idx = o[:, None] - self.window + np.arange(self.window)[None, :]  # (N, W)
        valid = idx >= 0
        vals = _gather(y, idx, 0.0)
        count = valid.sum(axis=1)
        level = np.divide(vals.sum(axis=1), count, out=np.zeros(o.size), where=count > 0)
        return _flat(level, horizon)


def _ewma_levels(y: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """(T,) x (A,) -> (T, A) levels after each observation, started at y[0].

    A loop over time, vectorised over the alpha grid: the recursion is inherently sequential and
    T is a few thousand, so this is milliseconds; scipy.signal.lfilter would save little and add a
    dependency.
    """
    levels = np.empty((y.size, alphas.size))
    level = np.full(alphas.size, y[0])
    levels[0] = level
    for t in range(1, y.size):
        level = alphas * y[t] + (1.0 - alphas) * level
        levels[t] = level
    return levels


class Ewma:
    """Exponentially weighted level (simple exponential smoothing), repeated over the horizon.

    `fit` picks `alpha` from `alphas` by one-step-ahead in-sample MAE on the train part: MAE,
    not squared error, because the series is bursty and heavy-tailed, and MAE is what the
    evaluation scores. Ties go to the smaller alpha (the smoother forecast). A one-value grid fixes
    alpha.
    """

    name = "ewma"

    def __init__(self, alphas: Sequence[float] | None = None) -> None:
        grid = np.asarray(DEFAULT_ALPHAS if alphas is None else alphas, dtype=np.float64)
        if grid.ndim != 1 or grid.size == 0 or np.any((grid <= 0) | (grid > 1)):
            raise ValueError("alphas must be a non-empty 1-D grid of values in (0, 1]")
        self.alphas = grid
        self.alpha: float | None = None

    def fit(self, train: np.ndarray) -> Ewma:
        y = _train_part(train)
        if self.alphas.size == 1:
            self.alpha = float(self.alphas[0])
            return self
        if y.size < 2:
            raise ValueError("ewma needs at least 2 train points to choose alpha")
        levels = _ewma_levels(y, self.alphas)
        errors = np.abs(y[1:, None] - levels[:-1]).mean(axis=0)  # (A,)
        self.alpha = float(self.alphas[int(np.argmin(errors))])
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if self.alpha is None:
            raise RuntimeError("ewma: call fit() before forecast()")
        y, o = _check_args(series, origins, horizon)
        level = np.zeros(o.size)
        if o.size and o.max() > 0:
            levels = _ewma_levels(y[: o.max()], np.array([self.alpha]))[:, 0]
            level = _gather(levels, o - 1, 0.0)
        return _flat(level, horizon)


def _lags(y: np.ndarray, o: np.ndarray, p: int) -> np.ndarray:
    """(N, p) lag matrix [y[o-1], ..., y[o-p]]; lags before the start are the mean of y[:o]."""
    idx = o[:, None] - 1 - np.arange(p)[None, :]
    return _gather(y, idx, _prefix_means(y, o)[:, None])


def _fit_ar(y: np.ndarray, p: int) -> tuple[float, np.ndarray]:
    """Least-squares AR(p) with intercept on y; returns (intercept, coef lag 1..p)."""
    rows = np.arange(p, y.size)
    if rows.size < p + 1:
        raise ValueError(f"AR({p}) needs at least {2 * p + 1} points, got {y.size}")
    design = np.column_stack([np.ones(rows.size), _lags(y, rows, p)])
    beta = np.linalg.lstsq(design, y[rows], rcond=None)[0]
    return float(beta[0]), beta[1:]


def _one_step(y: np.ndarray, o: np.ndarray, intercept: float, coef: np.ndarray) -> np.ndarray:
    return np.maximum(intercept + _lags(y, o, coef.size) @ coef, 0.0)


class AutoRegressive:
    """Least-squares AR(p) with intercept, iterated recursively over the horizon, clipped at 0.

    `fit` chooses p from `orders` (default 1..min(max_order, len(train) // 10)) by one-step MAE
    on the last `val_frac` of the train part, fitting each candidate on the rest, then refits the
    chosen p on the whole train part. Validation MAE rather than AIC: AIC assumes Gaussian errors,
    and on bursty heavy-tailed counts it rewards fitting the bursts; validation MAE measures what
    the evaluation scores. A one-value `orders` fixes p.

    Each recursive step is clipped at 0 before it feeds the next, since demand cannot go negative.
    """

    name = "ar"

    def __init__(
        self, orders: Sequence[int] | None = None, max_order: int = 24, val_frac: float = 0.2
    ) -> None:
        if orders is not None and (len(orders) == 0 or min(orders) < 1):
            raise ValueError("orders must be a non-empty sequence of integers >= 1")
        if not 0 < val_frac < 1:
            raise ValueError(f"val_frac must be in (0, 1), got {val_frac}")
        self.orders = None if orders is None else [int(p) for p in orders]
        self.max_order = int(max_order)
        self.val_frac = float(val_frac)
        self.p: int | None = None
        self.intercept = 0.0
        self.coef = np.zeros(0)

    def fit(self, train: np.ndarray) -> AutoRegressive:
        y = _train_part(train)
        orders = self.orders or list(range(1, max(1, min(self.max_order, y.size // 10)) + 1))
        p = orders[0] if len(orders) == 1 else self._select_order(y, orders)
        self.intercept, self.coef = _fit_ar(y, p)
        self.p = p
        return self

    def _select_order(self, y: np.ndarray, orders: list[int]) -> int:
        n_fit = y.size - max(1, round(self.val_frac * y.size))
        targets = np.arange(n_fit, y.size)
        best_p, best_mae = None, np.inf
        for p in orders:
            if n_fit < 2 * p + 1:
                continue
            intercept, coef = _fit_ar(y[:n_fit], p)
            err = float(np.mean(np.abs(y[targets] - _one_step(y, targets, intercept, coef))))
            if err < best_mae:
                best_p, best_mae = p, err
        if best_p is None:
            raise ValueError(f"train part of {y.size} points is too short for AR orders {orders}")
        return best_p

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if self.p is None:
            raise RuntimeError("ar: call fit() before forecast()")
        y, o = _check_args(series, origins, horizon)
        lags = _lags(y, o, self.p)  # (N, p), most recent first
        out = np.empty((o.size, horizon))
        for h in range(horizon):
            step = np.maximum(self.intercept + lags @ self.coef, 0.0)
            out[:, h] = step
            lags = np.concatenate([step[:, None], lags[:, :-1]], axis=1)
        out[o == 0] = 0.0
        return out


def baseline_suite(season: int | None) -> list[Forecaster]:
    """Fresh, unfitted instances of every baseline; seasonal naive only when a season is known."""
    suite: list[Forecaster] = [Naive()]
    if season is not None:
        suite.append(SeasonalNaive(season))
    suite.extend([MovingAverage(), Ewma(), AutoRegressive()])
    return suite

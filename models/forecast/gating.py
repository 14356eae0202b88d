"""Champion gating: every model judged on the same window, by the same per-key error.

A candidate, the current champion and the per-key baselines each forecast from every origin of
the evaluation window, seeing only the demand before it; `evaluate_on_window` scores the
per-key allocation, `models.warmup.hot_set.recall_on_window` what the same forecasts make of
the planner's hot set, and `promotion_decision` turns the numbers into a yes/no with a reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from data_contracts import GRANULARITIES
from models.forecast.panel import OTHER_KEY, TOTAL_KEY, DemandGrid, tail_coverage

# (the demand of the buckets before the origin, the origin) -> the `KeyForecast` from the
# origin on, validated by the model that made it (`PanelForecaster.forecast`): validated again
# here, the gate paid 22 ms an origin and model, 16 minutes of a training at 5 s
PredictFn = Callable[[DemandGrid, pd.Timestamp], pd.DataFrame]


def bucket_width(demand: pd.DataFrame) -> pd.Timedelta:
    return pd.Timedelta(seconds=GRANULARITIES[str(demand["granularity"].iloc[0])])


@dataclass(frozen=True)
class Allocation:
    """One forecast's rows against what came (`WindowActuals.allocate`): its named keys in its
    own order, then one `__other__` row per tenant, which partition each tenant's traffic."""

    tenants: np.ndarray  # (R,) object
    keys: np.ndarray  # (R,) object
    group: np.ndarray  # (R,) int64: each row's tenant, an index into the forecast's tenants
    predicted: np.ndarray  # (R, H) float64
    actual: np.ndarray  # (R, H) float64
    grid_rows: np.ndarray  # (named,) int64: each named key's row of the grid; -1: never asked

    @property
    def named(self) -> np.ndarray:
        """(R,) bool: the rows of named keys (not `__other__`)."""
        return self.keys != OTHER_KEY

    def tenant_errors(self) -> np.ndarray:
        """(tenants, H) the sum over each tenant's rows of |predicted - actual|, per step."""
        errors = np.zeros((int(self.group.max()) + 1, self.predicted.shape[1]))
        np.add.at(errors, self.group, np.abs(self.predicted - self.actual))
        return errors


class WindowActuals:
    """What came in every bucket, per key and per tenant, read from the window's `DemandGrid`:
    the gate scores a forecast per origin and model (44,070 at 5 s on the demo's lake), and
    filtering and grouping the demand rows for each took 19 ms, 14 minutes of a training."""

    def __init__(self, grid: DemandGrid) -> None:
        self.grid = grid
        tenants = grid.keys["tenant"].to_numpy(dtype=object)
        keys = grid.keys["key"].to_numpy(dtype=object)
        self._row = {pair: i for i, pair in enumerate(zip(tenants, keys, strict=True))}
        # (T,) each tenant's requests per bucket: its `__total__`, else the sum of its keys
        self._total: dict[Any, np.ndarray] = {}
        for tenant in pd.unique(tenants):
            mine = tenants == tenant
            total = mine & (keys == TOTAL_KEY)
            rows = total if total.any() else mine
            self._total[tenant] = grid.dense[rows].sum(0)

    def column(self, origin: pd.Timestamp) -> int:
        """The grid's bucket starting at `origin`."""
        offset = pd.Timestamp(origin) - self.grid.starts[0]
        if offset < pd.Timedelta(0):
            raise ValueError(f"origin {origin} is before the window's demand")
        if offset % self.grid.width:
            raise ValueError(f"origin {origin} is not a bucket start of the window's demand")
        return int(offset // self.grid.width)

    def _span(self, series: np.ndarray, first: int, horizon: int) -> np.ndarray:
        """(..., H) buckets [first, first + horizon) of `series` (..., T); none after its end."""
        part = series[..., first : first + horizon]
        missing = horizon - part.shape[-1]
        return np.pad(part, [(0, 0)] * (part.ndim - 1) + [(0, missing)]) if missing else part

    def allocate(self, forecast: pd.DataFrame, origin: pd.Timestamp, horizon: int) -> Allocation:
        """The rows `forecast` allocates over steps 1..horizon against what came.

        Step s is scored against the bucket starting at origin + (s - 1) x width. Every tenant
        of the forecast gets one `__other__` row (predicted 0 where the forecast has none), whose
        actual is the tenant's `__total__` (else the sum of its keys) less its named keys'.
        """
        if forecast.empty:
            raise ValueError(f"an empty forecast from origin {origin}")
        if forecast["step"].max() < horizon:
            raise ValueError(f"the forecast covers {forecast['step'].max()} steps, not {horizon}")
        rows = forecast[forecast["step"] <= horizon]
        tenant = rows["tenant"].to_numpy(dtype=object)
        key = rows["key"].to_numpy(dtype=object)
        code_of: dict[tuple[Any, Any], int] = {}
        codes = np.fromiter(
            (code_of.setdefault(pair, len(code_of)) for pair in zip(tenant, key, strict=True)),
            dtype=np.int64,
            count=len(rows),
        )  # (rows,) each row's (tenant, key), in order of appearance
        steps = rows["step"].to_numpy(dtype=np.int64) - 1
        cells = codes * horizon + steps  # (rows,) each row's (tenant, key, step)
        if (
            steps.min() < 0
            or len(cells) != len(code_of) * horizon
            or len(np.unique(cells)) != len(cells)
        ):
            raise ValueError(
                f"the forecast from origin {origin} needs one row per (tenant, key) and step "
                f"1..{horizon}"
            )
        predicted = np.zeros((len(code_of), horizon))  # (pairs, H)
        predicted[codes, steps] = rows["predicted"].to_numpy(dtype=np.float64)
        pairs = list(code_of)
        tenants = list(pd.unique(tenant))
        group_of = {t: i for i, t in enumerate(tenants)}
        named = np.array([k != OTHER_KEY for _, k in pairs], dtype=bool)
        first = self.column(origin)
        named_pairs = [p for p, n in zip(pairs, named, strict=True) if n]
        grid_rows = np.array([self._row.get(pair, -1) for pair in named_pairs], dtype=np.int64)
        actual = self._span(self.grid.dense, first, horizon)[grid_rows]  # (named, H)
        actual[grid_rows < 0] = 0.0  # a key the demand never had
        group = np.array([group_of[t] for t, _ in named_pairs], dtype=np.int64)
        named_actual = np.zeros((len(tenants), horizon))
        np.add.at(named_actual, group, actual)
        other_predicted = np.zeros((len(tenants), horizon))
        for i in np.flatnonzero(~named):
            other_predicted[group_of[pairs[i][0]]] = predicted[i]
        total = np.stack(
            [self._span(self._total.get(t, np.zeros(0)), first, horizon) for t in tenants]
        )  # (tenants, H)
        return Allocation(
            np.array([t for t, _ in named_pairs] + tenants, dtype=object),
            np.array([k for _, k in named_pairs] + [OTHER_KEY] * len(tenants), dtype=object),
            np.concatenate([group, np.arange(len(tenants))]),
            np.concatenate([predicted[named], other_predicted]),
            np.concatenate([actual, np.clip(total - named_actual, 0.0, None)]),
            grid_rows,
        )


def rolling_forecasts(
    predict_fn: PredictFn, grid: DemandGrid, origins: Sequence[pd.Timestamp]
) -> list[pd.DataFrame]:
    """One forecast per origin, each from the demand strictly before it, starting at it. The
    grid is the caller's, built once for every model judged on the window."""
    forecasts = []
    for origin in origins:
        forecast = predict_fn(grid.before(origin), origin)
        first = forecast.loc[forecast["step"] == 1, "bucket_start"]
        if not (first == origin).all():
            raise ValueError(f"a forecast from origin {origin} starts at {first.min()}")
        forecasts.append(forecast)
    return forecasts


def window_mae(
    forecasts: Sequence[pd.DataFrame],
    actuals: WindowActuals,
    origins: Sequence[pd.Timestamp],
    horizon: int,
) -> float:
    """`evaluate_on_window`'s error of forecasts already made, one per origin."""
    errors = [
        actuals.allocate(forecast, origin, horizon).tenant_errors().ravel()
        for forecast, origin in zip(forecasts, origins, strict=True)
    ]
    return float(np.concatenate(errors).mean())


def evaluate_on_window(
    predict_fn: PredictFn,
    demand: pd.DataFrame,
    origins_starts: Sequence[pd.Timestamp],
    horizon: int,
) -> float:
    """Mean absolute error of a model's per-key allocation, per (tenant, step), over origins.

    For each origin (a bucket start) `predict_fn` sees only the buckets before it and returns a
    `KeyForecast` whose step 1 is the origin's bucket; the error of a (tenant, step) is the sum
    over the tenant's rows of |predicted - actual|, where `__other__`'s actual is the tenant's
    `__total__` minus the actuals of its predicted keys (the sum of its unpredicted keys when it
    has no `__total__`).

    Why this compares models that chose different top keys: each model's rows partition the
    tenant's traffic, so every request is counted exactly once whichever keys a model named,
    and no model can lower its error by leaving a key out (the miss lands in `__other__`). The
    caveat: merging rows can only lower the sum (triangle inequality), so a model with a much
    smaller top_k faces an easier partition; the gate runs every model on the candidate's panel.
    """
    grid = DemandGrid.of(demand)
    return window_mae(
        rolling_forecasts(predict_fn, grid, origins_starts),
        WindowActuals(grid),
        origins_starts,
        horizon,
    )


HOT_SET_ALPHA = 0.05  # the one-sided p below which a candidate's hot set counts as worse


@dataclass(frozen=True)
class HotSetComparison:
    """The planner's recall with the candidate as its learned expert against the recall as it
    runs today (with the champion, or without a learned expert where it leaves the champion
    out), paired over the window's origins (`models.warmup.hot_set.recall_on_window`)."""

    candidate: np.ndarray  # (origins,) share of each origin's requests the hot set held
    today: np.ndarray  # (origins,) the same origins

    @property
    def p_fewer(self) -> float:
        """One-sided Wilcoxon signed-rank p that the candidate's recall is the lower, over the
        origins where the two differ; 1.0 when they never do. Why a test: most origins' top 50
        are the same with either model, and one key more or less in a few windows of hundreds is
        not a worse hot set. The equal origins are dropped before scipy sees them: given both
        samples, it picks its normal approximation from 50 origins on, counting the equal ones,
        which puts 3 lower origins of 240 at p 0.042 where the exact test over the 3 says 0.125."""
        from scipy import stats

        differences = self.candidate - self.today  # (origins,)
        differences = differences[differences != 0]
        if not differences.size:
            return 1.0
        return float(stats.wilcoxon(differences, alternative="less").pvalue)


def promotion_decision(
    candidate: float,
    champion: float | None,
    best_baseline: float,
    hot_set: HotSetComparison | None = None,
) -> tuple[bool, str]:
    """Promote iff strictly better than the champion (if any), no worse than every baseline, and,
    when `hot_set` is given, not making the planner's hot set recall significantly fewer requests
    (one-sided p below `HOT_SET_ALPHA`).

    Strictly, so re-training an identical model does not churn the alias; "no worse" against
    the baselines, because a candidate that *is* the best baseline is a legitimate champion.
    The hot set, because the alias decides which model the planner ranks keys with, and a lower
    per-key error can still name a worse top K; "significantly", because the error is what must
    improve and the hot set must only not get worse. The reason names every failed condition
    and the numbers, on one line.
    """
    numbers = f"candidate {candidate:.4f}, best baseline {best_baseline:.4f}"
    failed = [] if candidate <= best_baseline else ["worse than the best per-key baseline"]
    if champion is not None:
        numbers += f", champion {champion:.4f}"
        if not candidate < champion:
            failed.insert(0, "not better than the champion")
    if hot_set is not None:
        p_fewer = hot_set.p_fewer
        numbers += (
            f"; hot-set recall with the candidate {hot_set.candidate.mean():.4f}, today "
            f"{hot_set.today.mean():.4f}, p {p_fewer:.3f}"
        )
        if p_fewer < HOT_SET_ALPHA:
            failed.append("the planner's hot set recalls significantly fewer requests with it")
    if failed:
        return False, f"rejected: {'; '.join(failed)} ({numbers})"
    why = "first champion" if champion is None else "beats the champion"
    return True, f"promoted: {why} ({numbers})"


def tail_coverage_on_window(
    forecasts: Sequence[pd.DataFrame],
    actuals: WindowActuals,
    origins: Sequence[pd.Timestamp],
    horizon: int,
    tolerance: float = 0.5,
) -> float:
    """Share of tail keys whose demand over the horizon is predicted within tolerance.

    Tail = named keys outside the top 5% by their volume before the window (the train part);
    within tolerance = |predicted - actual| of the horizon's total <= max(1, tolerance x actual),
    as `panel.tail_coverage` defines it. Pooled over every origin of the window.
    """
    grid = actuals.grid
    before = grid.volume[:, min(actuals.column(min(origins)), len(grid.starts))]  # (N,)
    before = np.where(grid.keys["key"].to_numpy(dtype=object) == TOTAL_KEY, 0.0, before)
    predicted, actual, volumes = [], [], []
    for forecast, origin in zip(forecasts, origins, strict=True):
        rows = actuals.allocate(forecast, origin, horizon)
        named = rows.named
        predicted.append(rows.predicted[named].sum(1))
        actual.append(rows.actual[named].sum(1))
        volumes.append(np.where(rows.grid_rows >= 0, before[rows.grid_rows], 0.0))
    if not predicted or not sum(len(p) for p in predicted):
        return float("nan")
    return tail_coverage(
        np.concatenate(predicted), np.concatenate(actual), np.concatenate(volumes), tolerance
    )

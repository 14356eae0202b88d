"""Champion gating: every model judged on the same window, by the same per-key error.

A candidate, the current champion and the per-key baselines each forecast from every origin of
the evaluation window, seeing only the demand before it; `evaluate_on_window` scores the
per-key allocation, `models.warmup.hot_set.recall_on_window` what the same forecasts make of
the planner's hot set, and `promotion_decision` turns the numbers into a yes/no with a reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from data_contracts import GRANULARITIES, DemandSeries
from models.forecast.panel import OTHER_KEY, TOTAL_KEY, DemandGrid, tail_coverage

# (the demand of the buckets before the origin, the origin) -> the `KeyForecast` from the
# origin on, validated by the model that made it (`PanelForecaster.forecast`): validated again
# here, the gate paid 22 ms an origin and model, 16 minutes of a training at 5 s
PredictFn = Callable[[DemandGrid, pd.Timestamp], pd.DataFrame]


def bucket_width(demand: pd.DataFrame) -> pd.Timedelta:
    return pd.Timedelta(seconds=GRANULARITIES[str(demand["granularity"].iloc[0])])


def per_key_allocation(
    forecast: pd.DataFrame, demand: pd.DataFrame, origin: pd.Timestamp, horizon: int
) -> pd.DataFrame:
    """tenant, key, step, predicted, actual of each row a forecast allocates, steps 1..horizon.

    Step s is scored against the bucket starting at origin + (s - 1) x width. Every tenant gets
    one `__other__` row per step (predicted 0 when the forecast has none), so the rows always
    partition the tenant's traffic.
    """
    width = bucket_width(demand)
    if forecast["step"].max() < horizon:
        raise ValueError(f"the forecast covers {forecast['step'].max()} steps, not {horizon}")
    keys = ["tenant", "key", "step"]
    fc = forecast.loc[forecast["step"] <= horizon, [*keys, "predicted"]]
    fc = fc.astype({"tenant": object, "key": object})
    future = demand[
        (demand["bucket_start"] >= origin) & (demand["bucket_start"] < origin + horizon * width)
    ]
    future = pd.DataFrame(
        {
            "tenant": future["tenant"].astype(object),
            "key": future["key"].astype(object),
            "step": (future["bucket_start"] - origin) // width + 1,
            "actual": future["count"].to_numpy(),
        }
    )
    actual = future.groupby(keys)["actual"].sum().reset_index()
    named = fc[fc["key"] != OTHER_KEY].merge(actual, how="left", on=keys).fillna({"actual": 0.0})
    grid = pd.MultiIndex.from_product(
        [fc["tenant"].unique(), range(1, horizon + 1)], names=["tenant", "step"]
    )

    def per_tenant_step(frame: pd.DataFrame, column: str) -> pd.Series:
        return frame.groupby(["tenant", "step"])[column].sum().reindex(grid, fill_value=0.0)

    is_total = future["key"] == TOTAL_KEY
    with_total = grid.get_level_values("tenant").isin(
        demand.loc[demand["key"] == TOTAL_KEY, "tenant"]
    )
    total = per_tenant_step(future[is_total], "actual").where(
        with_total, per_tenant_step(future[~is_total], "actual")
    )
    other = pd.DataFrame(
        {
            "predicted": per_tenant_step(fc[fc["key"] == OTHER_KEY], "predicted"),
            "actual": (total - per_tenant_step(named, "actual")).clip(lower=0.0),
        }
    ).reset_index()
    other.insert(1, "key", OTHER_KEY)
    return pd.concat([named, other[[*keys, "predicted", "actual"]]], ignore_index=True)


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
    demand: pd.DataFrame,
    origins: Sequence[pd.Timestamp],
    horizon: int,
) -> float:
    errors = []
    for forecast, origin in zip(forecasts, origins, strict=True):
        rows = per_key_allocation(forecast, demand, origin, horizon)
        rows["error"] = (rows["predicted"] - rows["actual"]).abs()
        errors.append(rows.groupby(["tenant", "step"])["error"].sum().to_numpy())
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
    demand = DemandSeries.validate(demand, lazy=True)
    return window_mae(
        rolling_forecasts(predict_fn, DemandGrid.of(demand), origins_starts),
        demand,
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
    demand: pd.DataFrame,
    origins: Sequence[pd.Timestamp],
    horizon: int,
    tolerance: float = 0.5,
) -> float:
    """Share of tail keys whose demand over the horizon is predicted within tolerance.

    Tail = named keys outside the top 5% by their volume before the window (the train part);
    within tolerance = |predicted - actual| of the horizon's total <= max(1, tolerance x actual),
    as `panel.tail_coverage` defines it. Pooled over every origin of the window.
    """
    first = min(origins)
    before = demand[(demand["bucket_start"] < first) & (demand["key"] != TOTAL_KEY)]
    volume = before.groupby(["tenant", "key"], observed=True)["count"].sum()
    volume.index = volume.index.set_levels([lvl.astype(object) for lvl in volume.index.levels])
    predicted, actual, volumes = [], [], []
    for forecast, origin in zip(forecasts, origins, strict=True):
        rows = per_key_allocation(forecast, demand, origin, horizon)
        rows = rows[rows["key"] != OTHER_KEY].groupby(["tenant", "key"])[["predicted", "actual"]]
        totals = rows.sum()
        predicted.append(totals["predicted"].to_numpy())
        actual.append(totals["actual"].to_numpy())
        volumes.append(volume.reindex(totals.index, fill_value=0.0).to_numpy())
    if not predicted or not sum(len(p) for p in predicted):
        return float("nan")
    return tail_coverage(
        np.concatenate(predicted), np.concatenate(actual), np.concatenate(volumes), tolerance
    )

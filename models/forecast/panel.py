"""Per-key demand forecasting: the top keys plus "other", one model for all of them.

`KeyPanel` turns a sparse `DemandSeries` frame into a dense (K, T) matrix: the `top_k` keys by
recent demand, plus one `__other__` row per tenant holding the rest of that tenant's traffic, so
the rows of a tenant always add up to its total and a key that climbs into the top K later was
not lost meanwhile. `PanelForecaster` is the per-key `preheat`: it chooses on a validation slice
between the attention model trained on every row at once (with long-tail sampling) and per-key
baselines (last value, moving average, EWMA with one alpha fitted over all keys), then refits the
winner on the whole train part. What it predicts is a `KeyForecast` frame.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pandera.typing import DataFrame

from data_contracts import GRANULARITIES, TOTAL_KEY, DemandSeries, KeyForecast
from data_contracts.dtypes import STRING
from models.forecast.attention import (
    AttentionConfig,
    ForecastModule,
    predict,
    train_module,
)
from models.forecast.weighting import key_weights

OTHER_KEY = "__other__"
EWMA_GRID = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


@dataclass
class KeyPanel:
    """(K, T) demand of the top keys and each tenant's "other", on one dense bucket grid."""

    tenants: np.ndarray  # (K,) object
    keys: np.ndarray  # (K,) object
    starts: pd.DatetimeIndex  # (T,) bucket starts
    counts: np.ndarray  # (K, T) float64
    granularity: str

    @property
    def width(self) -> pd.Timedelta:
        return pd.Timedelta(seconds=GRANULARITIES[self.granularity])

    @classmethod
    def from_demand(
        cls, demand: DataFrame[DemandSeries], top_k: int = 100, recent: int = 48
    ) -> KeyPanel:
        """Build from one granularity of `DemandSeries`; top keys by their last `recent` buckets."""
        demand = DemandSeries.validate(demand, lazy=True)
        granularities = demand["granularity"].unique()
        if len(granularities) != 1:
            raise ValueError(f"one granularity per panel, got {sorted(granularities)}")
        granularity = str(granularities[0])
        width = pd.Timedelta(seconds=GRANULARITIES[granularity])
        starts = pd.date_range(
            demand["bucket_start"].min(), demand["bucket_start"].max(), freq=width
        )
        column = ((demand["bucket_start"] - starts[0]) // width).to_numpy()
        wide = pd.DataFrame(
            {
                "tenant": demand["tenant"].astype(object),
                "key": demand["key"].astype(object),
                "col": column,
                "count": demand["count"].to_numpy(),
            }
        )
        keys = wide[["tenant", "key"]].drop_duplicates().reset_index(drop=True)
        row = pd.MultiIndex.from_frame(keys).get_indexer(
            pd.MultiIndex.from_frame(wide[["tenant", "key"]])
        )
        dense = np.zeros((len(keys), len(starts)))
        np.add.at(dense, (row, wide["col"].to_numpy()), wide["count"].to_numpy())
        return cls._select(keys, dense, starts, granularity, top_k, recent)

    @classmethod
    def _select(
        cls,
        keys: pd.DataFrame,
        dense: np.ndarray,
        starts: pd.DatetimeIndex,
        granularity: str,
        top_k: int,
        recent: int,
    ) -> KeyPanel:
        is_total = (keys["key"] == TOTAL_KEY).to_numpy()
        candidates = np.flatnonzero(~is_total)
        recent_volume = dense[candidates, -recent:].sum(1)
        order = np.lexsort((-dense[candidates].sum(1), -recent_volume))  # recent, then all-time
        chosen = candidates[order[:top_k]]
        rows, tenants, names = (
            [dense[chosen]],
            list(keys["tenant"][chosen]),
            list(keys["key"][chosen]),
        )
        for tenant in keys["tenant"].unique():
            mine = (keys["tenant"] == tenant).to_numpy()
            total_rows = np.flatnonzero(mine & is_total)
            total = dense[total_rows[0]] if len(total_rows) else dense[mine & ~is_total].sum(0)
            kept = dense[np.intersect1d(chosen, np.flatnonzero(mine))].sum(0)
            rows.append(np.clip(total - kept, 0, None)[None, :])
            tenants.append(tenant)
            names.append(OTHER_KEY)
        return cls(
            np.array(tenants, dtype=object),
            np.array(names, dtype=object),
            starts,
            np.concatenate(rows),
            granularity,
        )


def _ewma_level(counts: np.ndarray, origin: int, alpha: float) -> np.ndarray:
    """(K,) EWMA of each row over buckets [0, origin)."""
    level = counts[:, 0].copy()
    for t in range(1, origin):
        level += alpha * (counts[:, t] - level)
    return level


def baseline_levels(counts: np.ndarray, origin: int, method: str, alpha: float) -> np.ndarray:
    """(K,) the flat per-key forecast of a baseline from buckets before `origin`."""
    if method == "last_value":
        return counts[:, origin - 1]
    if method == "moving_average":
        return counts[:, max(0, origin - 5) : origin].mean(1)
    if method == "ewma":
        return _ewma_level(counts, origin, alpha)
    raise ValueError(f"unknown panel baseline {method!r}")


PANEL_BASELINES = ("last_value", "moving_average", "ewma")


@dataclass
class PanelForecaster:
    """Per-key `preheat`: attention over all keys or a per-key baseline, chosen on validation."""

    config: AttentionConfig = field(default_factory=AttentionConfig)
    val_frac: float = 0.2
    chosen: str = ""
    alpha: float = 0.3
    validation_mae: dict[str, float] = field(default_factory=dict)
    module: ForecastModule | None = None

    def _train(self, counts: np.ndarray, until: int) -> ForecastModule:
        origins = np.arange(1, until - self.config.horizon + 1)
        if len(origins) < 2:
            raise ValueError(
                f"{until} buckets are too few to train for horizon {self.config.horizon}"
            )
        rows = np.repeat(np.arange(len(counts)), len(origins))  # (K * O,)
        weights = np.repeat(key_weights(counts[:, :until]), len(origins))
        return train_module(counts, rows, np.tile(origins, len(counts)), self.config, weights)

    def _fit_alpha(self, counts: np.ndarray, until: int) -> float:
        def one_step_mae(alpha: float) -> float:
            errors = [
                np.abs(_ewma_level(counts, t, alpha) - counts[:, t]).mean() for t in range(1, until)
            ]
            return float(np.mean(errors))

        return min(EWMA_GRID, key=one_step_mae)

    def _predict(
        self,
        method: str,
        counts: np.ndarray,
        origin: int,
        module: ForecastModule | None,
        alpha: float,
    ) -> np.ndarray:
        horizon = self.config.horizon
        if method == "attention":
            assert module is not None
            rows = np.arange(len(counts))
            return predict(module, counts, rows, np.full(len(counts), origin))  # (K, H)
        return np.repeat(baseline_levels(counts, origin, method, alpha)[:, None], horizon, 1)

    def fit(self, panel: KeyPanel, until: int | None = None) -> PanelForecaster:
        """Choose on the last `val_frac` of buckets [0, until), then refit on all of them."""
        counts = panel.counts
        until = counts.shape[1] if until is None else until
        horizon = self.config.horizon
        val_start = int(until * (1 - self.val_frac))
        origins = np.arange(val_start, until - horizon + 1)
        if len(origins) < 1:
            raise ValueError(f"{until} buckets leave no validation origin for horizon {horizon}")
        part = counts[:, :val_start]
        alpha = self._fit_alpha(part, val_start)
        candidates: dict[str, ForecastModule | None] = dict.fromkeys(PANEL_BASELINES)
        # Too little history for the model: the baselines still compete without it.
        with contextlib.suppress(ValueError):
            candidates["attention"] = self._train(part, val_start)
        scores = {}
        for method, module in candidates.items():
            errors = [
                np.abs(
                    self._predict(method, counts, o, module, alpha) - counts[:, o : o + horizon]
                ).mean()
                for o in origins
            ]
            scores[method] = float(np.mean(errors))
        self.validation_mae = scores
        self.chosen = min(scores, key=lambda m: (scores[m], m))
        self.alpha = self._fit_alpha(counts[:, :until], until)
        self.module = self._train(counts[:, :until], until) if self.chosen == "attention" else None
        return self

    def forecast_counts(self, counts: np.ndarray, origin: int) -> np.ndarray:
        """(K, H) forecasts of every row from buckets before `origin`."""
        if not self.chosen:
            raise RuntimeError("fit the panel forecaster before forecasting")
        return self._predict(self.chosen, counts, origin, self.module, self.alpha)

    def forecast(self, panel: KeyPanel) -> DataFrame[KeyForecast]:
        """Per-key predictions for the `horizon` buckets after the panel's last bucket."""
        horizon = self.config.horizon
        predicted = self.forecast_counts(panel.counts, panel.counts.shape[1])  # (K, H)
        steps = np.arange(1, horizon + 1)
        frame = pd.DataFrame(
            {
                "tenant": pd.array(np.repeat(panel.tenants, horizon), dtype=STRING),
                "key": pd.array(np.repeat(panel.keys, horizon), dtype=STRING),
                "granularity": panel.granularity,
                "step": np.tile(steps, len(panel.keys)),
                "bucket_start": np.tile(panel.starts[-1] + panel.width * steps, len(panel.keys)),
                "predicted": predicted.reshape(-1),  # (K, H) -> (K*H,) key-major
            }
        )
        return KeyForecast.validate(frame, lazy=True)

    def describe(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "alpha": self.alpha, "validation_mae": self.validation_mae}


def tail_coverage(
    predicted: np.ndarray, actual: np.ndarray, volume: np.ndarray, tolerance: float = 0.5
) -> float:
    """Share of tail keys whose next-window demand is predicted within tolerance.

    Tail = keys outside the top 5% by `volume` (train demand). Within tolerance: the absolute
    error of the window's total is at most max(1 request, `tolerance` x actual) — one request
    because a tail key's window often holds zero or one, where a relative bound means nothing.
    predicted, actual: (K,) window totals; volume: (K,).
    """
    cutoff = np.quantile(volume, 0.95)
    tail = volume < cutoff if np.any(volume < cutoff) else np.ones(len(volume), dtype=bool)
    bound = np.maximum(1.0, tolerance * actual[tail])
    return float(np.mean(np.abs(predicted[tail] - actual[tail]) <= bound))

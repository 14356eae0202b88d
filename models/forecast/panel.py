"""Per-key demand forecasting: the top keys plus "other", one model for all of them.

`KeyPanel` turns a sparse `DemandSeries` frame into a dense (K, T) matrix: the `top_k` keys by
recent demand, plus one `__other__` row per tenant holding the rest of that tenant's traffic, so
the rows of a tenant always add up to its total and a key that climbs into the top K later was
not lost meanwhile. `PanelForecaster` is the per-key `preheat`: the online combination
(`combination.Combination`) of the attention model trained on every row at once (with long-tail
sampling) and per-key baselines (last value, moving average, EWMA with one alpha fitted over all
keys); its weights start from the errors on a held-back slice and go on learning from every
forecast's past buckets (`current_weights`). What it predicts is a `KeyForecast` frame; the
registry's gate and the warm-up planner read it.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pandera.typing import DataFrame
from scipy.signal import lfilter

from data_contracts import GRANULARITIES, TOTAL_KEY, DemandSeries, KeyForecast
from data_contracts.dtypes import STRING
from models.forecast.attention import (
    AttentionConfig,
    ForecastModule,
    Windows,
    multiscale_windows,
    predict_windows,
    train_module,
)
from models.forecast.combination import Combination, online_weights
from models.forecast.evaluation import origin_targets
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
        cls,
        demand: DataFrame[DemandSeries],
        top_k: int = 100,
        recent: int = 48,
        until: pd.Timestamp | None = None,
    ) -> KeyPanel:
        """Build from one granularity of `DemandSeries`; top keys by their last `recent` buckets
        (then by all their demand, then by tenant and key).

        The grid ends at the demand's last bucket, or, with `until` (a bucket start after it),
        at the bucket before `until`: the buckets between saw no request, which the rows (one
        per key and bucket with requests) cannot say. A forecast of the panel then starts at
        `until`, as a forecast made at that time must: the gate's rolling forecasts from an
        origin after idle buckets (at 5 s, most of the demo lake's 8,814 origins) started at
        the bucket after the last row, and were scored against the origin's."""
        grid = DemandGrid.of(demand)
        if until is not None and pd.Timestamp(until) <= grid.starts[-1]:
            raise ValueError(
                f"until {until} must be a bucket start after the demand's last, {grid.starts[-1]}"
            )
        return grid.panel(top_k, recent, grid.starts[-1] + grid.width if until is None else until)


@dataclass(frozen=True)
class DemandGrid:
    """Every key's demand on one dense bucket grid, built once: a panel as of any bucket
    (`panel`) is read from it, as `KeyPanel.from_demand` would build it from the rows before
    that bucket. The gate forecasts from every origin of its window; rebuilt from the rows
    each time (validated and pivoted again), a panel cost 85 ms an origin and model at 5 s.
    The keys are in (tenant, key) order, whatever the rows' order: the same demand makes the
    same panel."""

    keys: pd.DataFrame  # (N,) tenant, key: every key of the demand, `TOTAL_KEY` included
    dense: np.ndarray  # (N, T) float64
    volume: np.ndarray  # (N, T + 1) float64: each key's requests before each bucket
    first: np.ndarray  # (N,) the bucket of each key's first row
    starts: pd.DatetimeIndex  # (T,)
    granularity: str

    @property
    def width(self) -> pd.Timedelta:
        return pd.Timedelta(seconds=GRANULARITIES[self.granularity])

    @classmethod
    def of(cls, demand: DataFrame[DemandSeries]) -> DemandGrid:
        demand = DemandSeries.validate(demand, lazy=True)
        if demand.empty:
            raise ValueError("no demand to build a panel from")
        granularities = demand["granularity"].unique()
        if len(granularities) != 1:
            raise ValueError(f"one granularity per panel, got {sorted(granularities)}")
        granularity = str(granularities[0])
        width = pd.Timedelta(seconds=GRANULARITIES[granularity])
        starts = pd.date_range(
            demand["bucket_start"].min(), demand["bucket_start"].max(), freq=width
        )
        column = ((demand["bucket_start"] - starts[0]) // width).to_numpy()
        pairs = pd.MultiIndex.from_arrays(
            [demand["tenant"].astype(object), demand["key"].astype(object)]
        )
        keys = pairs.unique().sort_values()
        row = keys.get_indexer(pairs)
        dense = np.zeros((len(keys), len(starts)))
        np.add.at(dense, (row, column), demand["count"].to_numpy())
        first = np.full(len(keys), len(starts), dtype=np.int64)
        np.minimum.at(first, row, column)
        volume = np.zeros((len(keys), len(starts) + 1))
        np.cumsum(dense, axis=1, out=volume[:, 1:])
        for array in (dense, volume, first):  # shared by every origin's model: read only
            array.flags.writeable = False
        frame = keys.to_frame(index=False, name=["tenant", "key"])
        return cls(frame, dense, volume, first, starts, granularity)

    def before(self, until: pd.Timestamp) -> DemandGrid:
        """The grid of the buckets before `until` only (read-only views, nothing copied): what a
        model forecasting at `until` may read. `keys` still names every key of the window; one
        first seen from `until` on has no bucket here, its `first` says so (the grid's end),
        and `panel` leaves it out."""
        seen = min(self._end(until), len(self.starts))
        first = np.minimum(self.first, seen)
        first.flags.writeable = False
        return DemandGrid(
            self.keys,
            self.dense[:, :seen],
            self.volume[:, : seen + 1],
            first,
            self.starts[:seen],
            self.granularity,
        )

    def _end(self, until: pd.Timestamp) -> int:
        """The buckets from the grid's first to `until` (a bucket start after the first)."""
        offset = pd.Timestamp(until) - self.starts[0]
        if offset <= pd.Timedelta(0) or offset % self.width:
            raise ValueError(f"until {until} must be a bucket start after {self.starts[0]}")
        return int(offset // self.width)

    def panel(
        self, top_k: int, recent: int, until: pd.Timestamp, history: int | None = None
    ) -> KeyPanel:
        """The panel of the keys with a row before `until` (a bucket start after the first), on
        the grid's buckets before it: buckets past the grid's last are idle (see `from_demand`).

        With `history`, only the last `history` of those buckets (the keys are chosen as
        without it): what a forecast reads (`PanelForecaster.history`). At 5 s the whole past
        is 26-35k buckets, and copying it was a tenth of each of the gate's forecasts.
        """
        if history is not None and history < 1:
            raise ValueError(f"history must be at least 1 bucket, got {history}")
        end = self._end(until)  # buckets before `until`
        seen = min(end, len(self.starts))  # of them on the grid; the rest idle
        lo = 0 if history is None else max(0, end - history)  # the panel's first bucket
        on_grid = slice(min(lo, seen), seen)  # its buckets on the grid
        present = np.flatnonzero(self.first < seen)  # (P,) keys with a row before `until`
        keys = self.keys.iloc[present].reset_index(drop=True)
        is_total = (keys["key"] == TOTAL_KEY).to_numpy()
        candidates = np.flatnonzero(~is_total)
        candidate_rows = present[candidates]  # grid rows
        last = self.volume[candidate_rows, seen]  # (C,) all their requests before `until`
        # summed, not a difference of the running sums: equal demand must tie exactly (counts
        # may be fractional), so that the all-time volume breaks the tie
        recent_volume = self.dense[candidate_rows, max(0, end - recent) : seen].sum(1)  # (C,)
        order = np.lexsort((-last, -recent_volume))  # recent, then all-time, then the keys' order
        chosen = present[candidates[order[:top_k]]]  # grid rows
        rows, tenants, names = [self.dense[chosen, on_grid]], [], []
        tenants.extend(self.keys["tenant"].iloc[chosen])
        names.extend(self.keys["key"].iloc[chosen])
        chosen_tenants = self.keys["tenant"].to_numpy()[chosen]
        for tenant in keys["tenant"].unique():
            mine = present[(keys["tenant"] == tenant).to_numpy()]  # grid rows
            mine_total = mine[self.keys["key"].to_numpy()[mine] == TOTAL_KEY]
            if len(mine_total):
                total = self.dense[mine_total[0], on_grid]
            else:
                total = self.dense[mine, on_grid].sum(0)
            # summed in the grid's row order, as the rows' panel sums: the same to the last bit
            kept = self.dense[np.sort(chosen[chosen_tenants == tenant]), on_grid].sum(0)
            rows.append(np.clip(total - kept, 0, None)[None, :])
            tenants.append(tenant)
            names.append(OTHER_KEY)
        counts = np.concatenate(rows)
        if end > max(lo, seen):  # the idle buckets after the grid's last
            counts = np.pad(counts, ((0, 0), (0, end - max(lo, seen))))
        return KeyPanel(
            np.array(tenants, dtype=object),
            np.array(names, dtype=object),
            pd.date_range(self.starts[0] + lo * self.width, periods=end - lo, freq=self.width),
            counts,
            self.granularity,
        )


MOVING_AVERAGE_SPAN = 5  # buckets


def _ewma_before(counts: np.ndarray, origins: np.ndarray, alpha: float) -> np.ndarray:
    """(N, K) each row's EWMA over the buckets before each origin (>= 1), started at bucket 0:
    one pass up to the latest origin, however many origins are asked. The pass is scipy's
    `lfilter` (level[t + 1] = (1 - alpha) level[t] + alpha counts[t], the level at bucket 1 the
    first count): the loop over buckets in Python took 71 ms a call at 5 s (33k buckets), which
    the gate pays at every origin of its window."""
    origins = np.asarray(origins, dtype=np.int64)
    first = counts[:, 0].astype(np.float64)  # (K,) the level over bucket 0 alone
    if origins.size == 0 or origins.max() < 2:
        return np.tile(first, (origins.size, 1))  # origin 0 is never asked: it has no past
    # filtered as deviations from the first count, so that a flat series stays exactly flat
    # (else rounding in the 16th digit breaks `_fit_alpha`'s ties toward the smaller alpha)
    moves = counts[:, 1 : origins.max()] - first[:, None]  # (K, max origin - 1)
    levels, _ = lfilter([alpha], [1.0, alpha - 1.0], moves, axis=1, zi=np.zeros((len(first), 1)))
    levels += first[:, None]  # levels[:, j]: over buckets [0, j + 2)
    return np.where(origins[:, None] >= 2, levels[:, np.maximum(origins - 2, 0)].T, first)


def ewma_burn_in(alpha: float) -> int:
    """The least n with (1 - alpha)^n < 2^-53: n buckets after a cut, the EWMA started there
    differs from the one started earlier by under 2^-53 of the two levels' difference at the
    cut (absolute): float64's rounding where demand before and after the cut is of a size."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    return 0 if alpha == 1 else math.floor(-53 * math.log(2) / math.log1p(-alpha)) + 1


def baseline_levels(
    counts: np.ndarray, origins: np.ndarray, method: str, alpha: float
) -> np.ndarray:
    """(N, K) the flat per-key forecast of a baseline from the buckets before each origin."""
    if method == "last_value":
        return counts[:, np.asarray(origins) - 1].T
    if method == "moving_average":
        return np.stack([counts[:, max(0, o - MOVING_AVERAGE_SPAN) : o].mean(1) for o in origins])
    if method == "ewma":
        return _ewma_before(counts, origins, alpha)
    raise ValueError(f"unknown panel baseline {method!r}")


PANEL_BASELINES = ("last_value", "moving_average", "ewma")
COMBINED = "adahedge"
MAX_REPLAY = 48  # origins charged per forecast call: bounded cost per request
# (key, origin) samples per attention forward. Not all at once: on one CPU thread larger
# batches ran slower (48 rounds x 103 keys: 0.71 s in one batch, 0.39 s in 512s, 0.38 s a call
# per origin; measured 2026-12-05)
PREDICT_CHUNK = 512
# Each forecast replays up to MAX_REPLAY past rounds through the attention model, so the gate's
# consecutive origins, like a deployed model's consecutive calls, ask again for 47 of every 48
# samples. The fitted model's forecasts are kept by their exact input (`Windows.sample_keys`)
# and computed once; the store is emptied when it reaches this many samples (~150 bytes each).
MEMO_LIMIT = 200_000


@dataclass
class PanelForecaster:
    """Per-key `preheat`: the online combination of attention over all keys and the per-key
    baselines (`chosen == "adahedge"`), or one of them alone (`chosen` its name: the gate's
    baselines). The weights are shared by every key: one loss per origin, the mean absolute
    error over the panel's rows and the horizon, as the gate scores it."""

    config: AttentionConfig = field(default_factory=AttentionConfig)
    val_frac: float = 0.2
    chosen: str = ""
    alpha: float = 0.3
    validation_mae: dict[str, float] = field(default_factory=dict)
    module: ForecastModule | None = None
    weights: dict[str, float] = field(default_factory=dict)  # at the end of the fit
    hedge: dict[str, Any] = field(default_factory=dict)  # `Combination.state()` there
    fit_end: str = ""  # ISO start of the first bucket whose actuals the weights have not seen
    # the fitted module's forecasts by sample input (see MEMO_LIMIT), and the module they are of
    _memo: dict[bytes, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _memo_of: ForecastModule | None = field(default=None, repr=False, compare=False)

    @property
    def history(self) -> int | None:
        """The buckets before a panel's end that a forecast reads (`forecast`), or None for all
        of them. The oldest origin replayed is `MAX_REPLAY + horizon - 1` buckets back; from
        it, the attention model reads `context` tokens of the widest scale, the moving average
        `MOVING_AVERAGE_SPAN` buckets, and the EWMA all of them, but those more than
        `ewma_burn_in` back change it by under 2^-53 of the level then (see there). The rest of
        a long panel changes no forecast beyond that, and reading it was half of a forecast's
        time at 5 s (26-35k buckets). None with a season: its phase counts from the panel's
        first bucket."""
        config = self.config
        if config.season is not None:
            return None
        spans = (max(config.scales) * config.context, ewma_burn_in(self.alpha))
        reach = max(*spans, MOVING_AVERAGE_SPAN)
        return MAX_REPLAY + config.horizon - 1 + reach

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
        if until < 2:  # no one-step error to judge by: the default stays
            return self.alpha

        def one_step_mae(alpha: float) -> float:
            levels = _ewma_before(counts, np.arange(1, until), alpha)  # (until - 1, K)
            return float(np.abs(levels - counts[:, 1:until].T).mean(1).mean())

        return min(EWMA_GRID, key=one_step_mae)

    def _predict(
        self,
        method: str,
        counts: np.ndarray,
        origins: np.ndarray,
        module: ForecastModule | None,
        alpha: float,
    ) -> np.ndarray:
        """(N, K, H) every row's forecasts from each origin."""
        origins = np.asarray(origins, dtype=np.int64)
        n, k, horizon = len(origins), len(counts), self.config.horizon
        if method != "attention":
            levels = baseline_levels(counts, origins, method, alpha)  # (N, K)
            return np.repeat(levels[:, :, None], horizon, 2)
        assert module is not None
        rows, starts = np.tile(np.arange(k), n), np.repeat(origins, k)  # (N * K,) origin-major
        windows = multiscale_windows(counts, rows, starts, self.config)
        if module is not self.module:  # the pre-slice model of a fit: asked once, not kept
            return self._forward(module, windows).reshape(n, k, horizon)
        if self._memo_of is not module or len(self._memo) >= MEMO_LIMIT:
            self._memo, self._memo_of = {}, module
        keys = windows.sample_keys()
        memo = self._memo
        missing = [i for i, key in enumerate(keys) if key not in memo]
        if missing:
            computed = self._forward(module, windows.take(np.array(missing)))  # (M, H)
            memo.update(zip([keys[i] for i in missing], computed, strict=True))
        return np.stack([memo[key] for key in keys]).reshape(n, k, horizon)

    @staticmethod
    def _forward(module: ForecastModule, windows: Windows) -> np.ndarray:
        """(B, H) the model's forecasts, PREDICT_CHUNK samples a forward."""
        b = len(windows.last)
        out = [
            predict_windows(module, windows.take(np.arange(i, min(i + PREDICT_CHUNK, b))))
            for i in range(0, b, PREDICT_CHUNK)
        ]  # (B, H) each
        return np.concatenate(out)

    def fit(self, panel: KeyPanel, until: int | None = None) -> PanelForecaster:
        """Charge the experts' errors on the last `val_frac` of buckets [0, until), with the
        experts fitted before them; then refit the experts on all of them."""
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
        names = list(candidates)
        preds = np.stack(
            [self._predict(m, counts, origins, candidates[m], alpha) for m in names]
        )  # (M, N, K, H)
        targets = origin_targets(counts, origins, horizon)  # (N, K, H)
        losses = np.abs(preds - targets[None]).mean(axis=(2, 3)).T  # (N, M)
        known = np.clip(np.arange(len(origins)) - horizon + 1, 0, None)
        hedge = Combination(len(names))
        # (N + 1, M): each origin's weights from the ones before it, then those after them all
        online = online_weights(preds, targets, np.r_[known, len(origins)], hedge)
        mixed = np.einsum("mnkh,nm->nkh", preds, online[:-1])  # (N, K, H)
        self.weights = dict(zip(names, online[-1].tolist(), strict=True))
        self.validation_mae = dict(zip(names, losses.mean(0).tolist(), strict=True))
        self.validation_mae[COMBINED] = float(np.abs(mixed - targets).mean())
        # The names travel with the state: a saved model's JSON sorts the weights' keys.
        self.chosen, self.hedge = COMBINED, {**hedge.state(), "experts": names}
        self.fit_end = (panel.starts[until - 1] + panel.width).isoformat()
        self.alpha = self._fit_alpha(counts[:, :until], until)
        self.module = self._train(counts[:, :until], until) if "attention" in names else None
        return self

    def forecast_counts(
        self, counts: np.ndarray, origin: int, weights: dict[str, float] | None = None
    ) -> np.ndarray:
        """(K, H) forecasts of every row from buckets before `origin` (the combination: with
        `weights`, default those at the end of the fit)."""
        return self.forecast_counts_at(counts, np.array([origin]), weights)[0]

    def forecast_counts_at(
        self, counts: np.ndarray, origins: np.ndarray, weights: dict[str, float] | None = None
    ) -> np.ndarray:
        """(N, K, H) `forecast_counts` from each of `origins` (at least one), each expert in one
        pass over them all: the planner's champion expert forecasts its 24 past windows."""
        if not self.chosen:
            raise RuntimeError("fit the panel forecaster before forecasting")
        if self.chosen != COMBINED:
            mix = {self.chosen: 1.0}
        else:
            mix = self.weights if weights is None else weights
        origins = np.asarray(origins, dtype=np.int64)
        if origins.size == 0:
            raise ValueError("forecast from at least one origin")
        return sum(
            w * self._predict(m, counts, origins, self.module, self.alpha)
            for m, w in mix.items()
            if w > 0  # a pruned expert adds nothing: not even its forward pass
        )

    def current_weights(self, panel: KeyPanel) -> dict[str, float]:
        """The weights after charging the panel's origins whose actuals came after the fit (the
        latest `MAX_REPLAY` of them): the combination keeps learning in production. Not the
        `horizon - 1` origins before `fit_end`, which the fit could not charge yet: their
        actuals begin inside the buckets the experts were refitted on (the model's targets,
        the EWMA's alpha), so charging them with those experts would flatter them."""
        return self._learned(panel)[0]

    def _learned(self, panel: KeyPanel) -> tuple[dict[str, float], np.ndarray]:
        """(`current_weights`, (K, H) the forecast from the panel's end with them). Each expert
        forecasts the charged origins and the panel's end in one pass: the EWMA runs from the
        first bucket read at every pass, and two passes were 40 ms of a forecast's 140 at 5 s,
        which the gate pays at every origin. Only the panel's last `history` buckets are read."""
        history = self.history
        cut = 0 if history is None else max(0, panel.counts.shape[1] - history)
        counts, starts = panel.counts[:, cut:], panel.starts[cut:]  # what it reads
        end = counts.shape[1]
        if self.chosen != COMBINED:
            return {self.chosen: 1.0}, self.forecast_counts(counts, end)
        horizon = self.config.horizon
        fresh = np.flatnonzero(starts >= pd.Timestamp(self.fit_end))
        rounds = fresh[fresh + horizon <= end][-MAX_REPLAY:]
        hedge, names = Combination.from_state(self.hedge), list(self.hedge["experts"])
        origins = np.append(rounds, end)
        preds = np.stack(
            [self._predict(m, counts, origins, self.module, self.alpha) for m in names]
        )  # (M, R + 1, K, H)
        targets = origin_targets(counts, rounds, horizon)  # (R, K, H)
        for j in range(len(rounds)):
            hedge.update(preds[:, j], targets[j])  # (M, K, H), (K, H)
        weights = hedge.weights.tolist()
        # summed as `forecast_counts` sums a mix, in the experts' order
        predicted = sum(w * preds[i, -1] for i, w in enumerate(weights) if w > 0)  # (K, H)
        return dict(zip(names, weights, strict=True)), predicted

    def forecast(self, panel: KeyPanel) -> DataFrame[KeyForecast]:
        """Per-key predictions for the `horizon` buckets after the panel's last bucket."""
        horizon = self.config.horizon
        predicted = self._learned(panel)[1]  # (K, H)
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
        return {"chosen": self.chosen, "alpha": self.alpha, "validation_mae": self.validation_mae,
                "weights": self.weights}  # fmt: skip


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

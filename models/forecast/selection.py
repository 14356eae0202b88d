"""`preheat`: the platform's forecaster, an online combination of the attention model and baselines.

It is itself a `Forecaster`. `fit(train)` holds back the last `val_frac` of the train part, fits
every expert (the attention model and each baseline) on what is before it and charges their
per-origin errors on the held-back slice to the combination (`combination.Combination`); then it
refits every expert on the whole train part. `forecast` goes on charging errors as actuals
arrive: the weights of origin o come from the origins whose whole horizon ended before o, so
every row still reads only `series[:o]`, and the test part is never seen by fitting.

The held-back slice is charged with the experts fitted before it, not the refitted ones: those
have seen it, and their in-sample errors would favour the experts that overfit (AR, attention).
Rejected: choosing one expert (or an equal-weight blend of the best three) on the held-back
slice, which is what `preheat` did until 2026-12-02. It shipped whatever won there: on real
series whose winner changed later it lost to the best baseline by 4-12%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from models.forecast.attention import AttentionConfig, AttentionForecaster
from models.forecast.base import Forecaster
from models.forecast.baselines import baseline_suite
from models.forecast.combination import DEFAULT_SHARE, Combination, combine, online_weights
from models.forecast.evaluation import origin_targets, rolling_origins

COMBINATION = "adahedge"


@dataclass
class Selection:
    """What `preheat` combines and the held-back numbers it started from (logged to MLflow).

    `chosen` names the combination; `weights` are the experts' weights at the end of the train
    part, `validation_mae` each expert's MAE on the held-back slice.
    """

    chosen: str
    validation_mae: dict[str, float]
    weights: dict[str, float]
    validation_start: int
    notes: list[str] = field(default_factory=list)


class PreheatForecaster:
    """The online combination of attention and the baselines, updated as actuals arrive."""

    name = "preheat"

    def __init__(
        self,
        horizon: int,
        season: int | None = None,
        attention: AttentionConfig | None = None,
        val_frac: float = 0.2,
        candidates: Callable[[], list[Forecaster]] | None = None,
        share: float = DEFAULT_SHARE,
    ) -> None:
        self.horizon = horizon
        self.season = season
        self.attention_config = attention or AttentionConfig(horizon=horizon)
        self.val_frac = val_frac
        self.share = share
        self._candidates = candidates or self._default_candidates
        self.selection: Selection | None = None
        self.experts: list[Forecaster] = []
        self._rounds = np.zeros(0, dtype=np.int64)  # (R,) origins of the charged slice
        self._preds = np.zeros((0, 0, 0))  # (M, R, H) the experts' forecasts there
        self._targets = np.zeros((0, 0))  # (R, H) what came
        self._train_end = 0

    def _default_candidates(self) -> list[Forecaster]:
        return [AttentionForecaster(self.attention_config), *baseline_suite(self.season)]

    def fit(self, train: np.ndarray) -> PreheatForecaster:
        train = np.asarray(train, dtype=np.float64)
        val_start = int(len(train) * (1 - self.val_frac))
        n_origins = len(train) - self.horizon + 1 - val_start
        if n_origins < 4:
            raise ValueError(
                f"{len(train)} train buckets leave {max(n_origins, 0)} validation origins for "
                f"horizon {self.horizon}; give more data or a shorter horizon"
            )
        held_back = rolling_origins(val_start, len(train), self.horizon)
        fitted, notes = self._fit_candidates(train[:val_start])
        preds = np.stack([e.forecast(train, held_back, self.horizon) for e in fitted])
        targets = origin_targets(train, held_back, self.horizon)  # (N, H)
        self._rounds, self._train_end = held_back, len(train)
        self._preds, self._targets = preds, targets
        names = [e.name for e in fitted]
        by_name = {c.name: c for c in self._candidates()}
        self.experts = []
        for expert in fitted:
            try:
                self.experts.append(by_name[expert.name].fit(train))
            except ValueError as err:  # refit failed: the expert fitted before the slice stays
                notes.append(f"{expert.name} not refitted: {err}")
                self.experts.append(expert)
        weights = online_weights(
            preds, targets, [len(held_back)], Combination(len(fitted), self.share)
        )[0]
        losses = np.abs(preds - targets[None]).mean(axis=(1, 2))  # (M,)
        self.selection = Selection(
            COMBINATION,
            dict(zip(names, losses.tolist(), strict=True)),
            dict(zip(names, weights.tolist(), strict=True)),
            val_start,
            notes,
        )
        return self

    def _fit_candidates(self, part: np.ndarray) -> tuple[list[Forecaster], list[str]]:
        """Fit every candidate on `part`; a candidate that cannot fit is left out, with why."""
        fitted, notes = [], []
        for candidate in self._candidates():
            try:
                fitted.append(candidate.fit(part))
            except ValueError as err:  # e.g. too little data for the attention model's context
                notes.append(f"{candidate.name} left out: {err}")
        if not fitted:
            raise ValueError("no candidate forecaster could be fitted: " + "; ".join(notes))
        return fitted, notes

    def weights(self, series: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """(N, M) the experts' weights at each origin, from the errors known before it."""
        return self._weights_and_forecasts(np.asarray(series, np.float64), origins)[0]

    def _weights_and_forecasts(
        self, y: np.ndarray, origins: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        if not self.experts:
            raise RuntimeError("fit the preheat forecaster before forecasting")
        o = np.asarray(origins, dtype=np.int64)
        h, m = self.horizon, len(self.experts)
        if o.size == 0:
            return np.zeros((0, m)), np.zeros((m, 0, h))
        # Origins after the charged slice whose horizon has ended by the latest origin asked.
        first_live = self._train_end - h + 1
        live = np.arange(first_live, max(first_live, int(o.max()) - h + 1), dtype=np.int64)
        preds = np.stack([e.forecast(y, np.r_[live, o], h) for e in self.experts])  # (M, L+N, H)
        charged = np.concatenate([self._preds, preds[:, : live.size]], axis=1)  # (M, R, H)
        targets = np.concatenate([self._targets, origin_targets(y, live, h)])  # (R, H)
        ends = np.concatenate([self._rounds, live]) + h  # round j is known at origin >= ends[j]
        order = np.argsort(o, kind="stable")
        known = np.searchsorted(ends, o[order], side="right")
        weights = np.empty((o.size, m))  # (N, M)
        weights[order] = online_weights(charged, targets, known, Combination(m, self.share))
        return weights, preds[:, live.size :]

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if horizon > self.horizon:
            raise ValueError(f"the combination is scored at horizon {self.horizon}, not {horizon}")
        weights, preds = self._weights_and_forecasts(np.asarray(series, np.float64), origins)
        return combine(preds[:, :, :horizon], weights)  # (M, N, H) x (N, M) -> (N, H)

"""`preheat`: the platform's forecaster, which never ships a method that lost on validation.

It is itself a `Forecaster`: `fit(train)` holds back the last `val_frac` of the train part, fits
every candidate (the attention model and each baseline) on what is before it, and picks by
rolling-origin MAE on the held-back slice; then it refits the winner on the whole train part. The
test part is never seen, so what the evaluation scores is the choice a user would have deployed.

The blend is validated, not assumed: its members (the best three on the first half of the
validation slice, averaged with equal weights — equal weights are the combination that survives
small samples; fitted weights overfit them) are picked on the first half, and every candidate,
the blend included, is compared on the second half. Rejected: picking the blend's members and
judging it on the same slice, which favours the blend by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from models.forecast.attention import AttentionConfig, AttentionForecaster
from models.forecast.base import Forecaster
from models.forecast.baselines import baseline_suite
from models.forecast.evaluation import rolling_origins
from models.forecast.metrics import mae

BLEND_SIZE = 3


class Blend:
    """Equal-weight mean of fitted members' forecasts."""

    def __init__(self, members: Sequence[Forecaster]) -> None:
        self.members = list(members)
        self.name = "blend(" + "+".join(m.name for m in self.members) + ")"

    def fit(self, train: np.ndarray) -> Blend:
        for member in self.members:
            member.fit(train)
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        return np.mean([m.forecast(series, origins, horizon) for m in self.members], axis=0)


@dataclass
class Selection:
    """What `preheat` chose and the validation numbers it chose on (logged to MLflow)."""

    chosen: str
    validation_mae: dict[str, float]
    blend_members: list[str]
    validation_start: int
    notes: list[str] = field(default_factory=list)


def _validation_mae(
    candidate: Forecaster, series: np.ndarray, origins: np.ndarray, horizon: int
) -> float:
    targets = series[origins[:, None] + np.arange(horizon)[None, :]]
    return mae(targets, candidate.forecast(series, origins, horizon))


class PreheatForecaster:
    """Chooses on validation among attention, baselines and a blend; then refits the choice."""

    name = "preheat"

    def __init__(
        self,
        horizon: int,
        season: int | None = None,
        attention: AttentionConfig | None = None,
        val_frac: float = 0.2,
        candidates: Callable[[], list[Forecaster]] | None = None,
    ) -> None:
        self.horizon = horizon
        self.season = season
        self.attention_config = attention or AttentionConfig(horizon=horizon)
        self.val_frac = val_frac
        self._candidates = candidates or self._default_candidates
        self.selection: Selection | None = None
        self.model: Forecaster | None = None

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
        origins = rolling_origins(val_start, len(train), self.horizon)
        first, second = origins[: len(origins) // 2], origins[len(origins) // 2 :]
        fitted, notes = self._fit_candidates(train[:val_start])
        first_half = {c.name: _validation_mae(c, train, first, self.horizon) for c in fitted}
        ranked = sorted(fitted, key=lambda c: first_half[c.name])
        blend = Blend(ranked[:BLEND_SIZE])
        scores = {c.name: _validation_mae(c, train, second, self.horizon) for c in fitted}
        scores[blend.name] = _validation_mae(blend, train, second, self.horizon)
        chosen = min(scores, key=lambda name: (scores[name], name))
        self.selection = Selection(
            chosen, scores, [m.name for m in blend.members], val_start, notes
        )
        by_name = {c.name: c for c in self._candidates()}
        if chosen == blend.name:
            self.model = Blend([by_name[m.name] for m in blend.members])
        else:
            self.model = by_name[chosen]
        self.model.fit(train)
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

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("fit the preheat forecaster before forecasting")
        return self.model.forecast(series, origins, horizon)

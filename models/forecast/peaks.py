"""The next day's demand peaks: hourly request totals forecast a day ahead, and their peaks.

The forecaster is the project's chooser (`PreheatForecaster`) over the baselines with a 24-hour
season: the attention model is trained nightly per key; the total's daily tide is what seasonal
and autoregressive baselines capture well, at a cost of milliseconds. With less history than
the chooser needs to validate, seasonal naive (one day back) is used, and said so. The
`plan-peak-warmups` flow (`flows.serve.peaks`) schedules a warm-up ahead of each peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from models.forecast.baselines import SeasonalNaive, baseline_suite
from models.forecast.selection import PreheatForecaster

DAY_H = 24


@dataclass(frozen=True)
class PeakForecast:
    """The next `len(forecast)` hours after `history_end`, and which of them are peaks."""

    hours: list[pd.Timestamp]  # start of each forecast hour (UTC)
    forecast: np.ndarray  # (horizon,) predicted requests per hour
    peaks: list[pd.Timestamp]
    threshold: float  # a peak's forecast reaches this (factor x the recent median hour)
    forecaster: str


def hourly_totals(timestamps: pd.Series) -> pd.Series:
    """Requests per UTC hour, all tenants together, with empty hours as zeros."""
    if timestamps.empty:
        return pd.Series(dtype=float)
    stamps = pd.to_datetime(timestamps, utc=True)
    counts = stamps.dt.floor("h").value_counts().sort_index()
    full = pd.date_range(counts.index.min(), counts.index.max(), freq="h", tz="UTC")
    return counts.reindex(full, fill_value=0).astype(float)


def predict_peaks(history: pd.Series, horizon_h: int = DAY_H, factor: float = 1.5) -> PeakForecast:
    """Forecast `horizon_h` hours past `history` and pick the peaks.

    A peak is an hour whose forecast is a local maximum (no lower than either neighbour; the
    first of a plateau) and at least `factor` times the median hour of the last week: a busy
    hour worth a dedicated warm-up, not every wiggle of a flat day.

    Raises:
        ValueError: less than one day of history, or a bad horizon/factor.
    """
    if horizon_h < 1 or factor <= 0:
        raise ValueError(f"horizon_h must be >= 1 and factor > 0, got {horizon_h}, {factor}")
    if len(history) < DAY_H:
        raise ValueError(f"need at least {DAY_H} hours of history to forecast a day, got "
                         f"{len(history)}")  # fmt: skip
    values = history.to_numpy(dtype=np.float64)  # (T,)
    chooser = PreheatForecaster(
        horizon=horizon_h, season=DAY_H, candidates=lambda: baseline_suite(DAY_H)
    )
    try:
        model: Any = chooser.fit(values)
        name = f"preheat:{chooser.selection.chosen}" if chooser.selection else "preheat"
    except ValueError:  # too little history to validate a choice
        model, name = SeasonalNaive(DAY_H).fit(values), "seasonal_naive (short history)"
    forecast = model.forecast(values, np.array([len(values)]), horizon_h)[0]  # (horizon,)
    start = history.index[-1] + pd.Timedelta(hours=1)
    hours = list(pd.date_range(start, periods=horizon_h, freq="h"))
    threshold = factor * float(np.median(values[-7 * DAY_H :]))
    peaks = []
    for i, value in enumerate(forecast):
        left = forecast[i - 1] if i > 0 else -np.inf
        right = forecast[i + 1] if i + 1 < len(forecast) else -np.inf
        if value > left and value >= right and value >= threshold and value > 0:
            peaks.append(hours[i])
    return PeakForecast(hours, forecast, peaks, threshold, name)

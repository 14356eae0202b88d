"""Warm ahead of each predicted peak: forecast the next day's hourly demand, schedule warm-ups.

The 10-minute warm-up schedule keeps the cache fresh; a peak needs its warm-up finished before
the traffic arrives, so `plan-peak-warmups` (hourly) forecasts the total request rate for the
next `horizon_h` hours and creates one scheduled run of the warm-up deployment `lead_s` before
each predicted peak. Each run carries an idempotency key derived from its peak hour, so the
hourly re-plan never schedules the same peak twice, and a peak that moves gets its own run.

The forecaster is the project's chooser (`PreheatForecaster`) over the baselines with a 24-hour
season: the attention model is trained nightly per key; the total's daily tide is what seasonal
and autoregressive baselines capture well, at a cost of milliseconds. With less history than
the chooser needs to validate, seasonal naive (one day back) is used, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

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


def schedule_peak_warmups(
    peaks: list[pd.Timestamp], lead_s: float, deployment: str, now: pd.Timestamp
) -> list[dict[str, str]]:
    """One scheduled run of `deployment` per future peak, `lead_s` before it (idempotent)."""
    from prefect import get_client
    from prefect.states import Scheduled

    created = []
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        for peak in peaks:
            at = peak - pd.Timedelta(seconds=lead_s)
            if at <= now:
                continue  # the peak is too close to warm ahead of it: the interval run covers it
            run = client.create_flow_run_from_deployment(
                dep.id, state=Scheduled(scheduled_time=at.to_pydatetime()),
                idempotency_key=f"peak-warmup:{deployment}:{peak.isoformat()}",
                tags=["peak-warmup"],
            )  # fmt: skip
            created.append({"peak": peak.isoformat(), "run_at": at.isoformat(), "id": str(run.id)})
    return created


@flow(name="plan-peak-warmups")
def plan_peak_warmups_flow(
    data_dir: str = "data",
    warmup_deployment: str = "warmup/preheat",
    lead_s: float = 600,
    horizon_h: int = DAY_H,
    factor: float = 1.5,
) -> dict[str, Any]:
    """Forecast the lake's hourly demand and schedule a warm-up run ahead of each peak."""
    from data_contracts.lake import Lake

    logger = get_run_logger()
    stamps = Lake(Path(data_dir) / "lake").read("requests", columns=["timestamp"])["timestamp"]
    history = hourly_totals(stamps)
    if len(history) < DAY_H:
        logger.info("%d hours of requests: too little to forecast a day; nothing scheduled",
                    len(history))  # fmt: skip
        return {"hours": len(history), "peaks": [], "scheduled": []}
    result = predict_peaks(history, horizon_h, factor)
    now = pd.Timestamp.now(tz="UTC")
    scheduled = schedule_peak_warmups(result.peaks, lead_s, warmup_deployment, now)
    logger.info("forecast by %s: %d peaks above %.1f req/h; %d warm-ups scheduled",
                result.forecaster, len(result.peaks), result.threshold, len(scheduled))  # fmt: skip
    return {
        "hours": len(history), "forecaster": result.forecaster, "threshold": result.threshold,
        "peaks": [p.isoformat() for p in result.peaks], "scheduled": scheduled,
    }  # fmt: skip

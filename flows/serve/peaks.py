"""Warm ahead of each predicted peak: forecast the next day's hourly demand, schedule warm-ups.

The 10-minute warm-up schedule keeps the cache fresh; a peak needs its warm-up finished before
the traffic arrives, so `plan-peak-warmups` (hourly) forecasts the total request rate for the
next `horizon_h` hours (`models.forecast.peaks`) and creates one scheduled run of the warm-up
deployment `lead_s` before each predicted peak. Each run carries an idempotency key derived from
its peak hour, so the hourly re-plan never schedules the same peak twice, and a peak that moves
gets its own run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger

from models.forecast.peaks import DAY_H, hourly_totals, predict_peaks


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

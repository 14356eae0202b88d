"""Prefect flow `features`: per-key demand series at 5 s, 3 min and 1 h from the lake."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from data_contracts.derived import write_demand
from data_contracts.lake import lake_of
from models.features.demand import FEATURE_GRANULARITIES, demand_series


@task(name="build-demand")
def build_demand_task(data_dir: str) -> dict[str, int]:
    requests = lake_of(data_dir).read(
        "requests", columns=["timestamp", "tenant", "prefix_hashes", "template_id", "route"]
    )
    series = demand_series(requests, FEATURE_GRANULARITIES)
    features_dir = Path(data_dir) / "features"
    for granularity, frame in series.items():
        write_demand(features_dir, granularity, frame)
    return {granularity: len(frame) for granularity, frame in series.items()}


@flow(name="features")
def features_flow(data_dir: str = "data") -> dict[str, int]:
    """Rebuild the demand features; returns rows written per granularity."""
    return build_demand_task(data_dir)

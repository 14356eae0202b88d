"""Prefect flows `ingest` (files) and `ingest-stream` (live Redis Stream); thin wiring only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import flow, task

from data_contracts.lake import lake_of
from models.ingest.inbox import expand_paths
from models.ingest.pipeline import ingest_file
from models.ingest.stream import DEFAULT_GROUP, drain_into_lake


@task(name="ingest-file", retries=2, retry_delay_seconds=5)
def ingest_file_task(
    path: str, data_dir: str, format_name: str, tenant: str, epoch: str | None
) -> dict[str, object]:
    # Retrying is safe: the lake drops rows it already holds, so a retry only adds what is missing.
    stamp = pd.Timestamp(epoch) if epoch else None
    report = ingest_file(Path(path), lake_of(data_dir), format_name, tenant, stamp)
    return report.to_dict()


@flow(name="ingest")
def ingest_flow(
    paths: list[str],
    data_dir: str = "data",
    format_name: str = "auto",
    tenant: str = "default",
    epoch: str | None = None,
) -> dict[str, object]:
    """Ingest log files (or the log files of directories) into the lake; returns per-file
    reports and totals."""
    reports = [
        ingest_file_task(p, data_dir, format_name, tenant, epoch) for p in expand_paths(paths)
    ]
    totals = {k: sum(int(r[k]) for r in reports) for k in ("read", "accepted", "quarantined")}
    return {"files": reports, **totals}


@flow(name="ingest-stream")
def ingest_stream_flow(
    redis_url: str,
    data_dir: str = "data",
    stream: str = "preheat:requests",
    consumer: str = "ingest-1",
    group: str = DEFAULT_GROUP,
    max_batches: int | None = None,
    block_ms: int = 500,
    min_idle_ms: int = 30_000,
) -> dict[str, int]:
    """Drain the request stream into the lake (until empty, or `max_batches`)."""
    lake = lake_of(data_dir)
    totals = drain_into_lake(
        redis_url, lake, stream, consumer, group, block_ms, max_batches, min_idle_ms
    )
    return vars(totals)

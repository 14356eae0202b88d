"""Prefect flow `tune-decay`: tune the heat half-life (and the priority weight, when the window's
requests have several priorities) on the latest window, log it to MLflow, and write both where
the cache runtime reads them (`<data_dir>/tuning/decay.json`).

Thin by design (house style): the window and the publishing are
`models.heat.scheduled_tuning`'s, the MLflow run `models.heat.tracking`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from cache_runtime.heat import decay_params_path
from cache_runtime.traces import TraceError
from models.heat.scheduled_tuning import publish_decay, tune_window
from models.heat.tracking import log_tuning_run

__all__ = ["decay_params_path", "tune_decay_flow", "tune_window_task"]  # the path as before


@task(name="tune-decay-window")
def tune_window_task(
    trace: str | None, data_dir: str, window: int, capacity: float, rounds: int, grid: int
) -> dict[str, Any]:
    return tune_window(trace, data_dir, window, capacity, rounds, grid)


@flow(name="tune-decay")
def tune_decay_flow(
    trace: str | None = None,
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    window: int = 2000,
    capacity: float = 0.1,
    rounds: int = 10,
    grid: int = 40,
    skip_if_empty: bool = False,
) -> dict[str, Any]:
    """Tune on the last `window` requests of `trace` (a Mooncake-format file) or, without one,
    of the lake; log, publish. Only a result at least as good as the default is published (the
    tuner evaluates the default first, so its best never is worse). When the window's requests
    all have one priority the weight was not searched, and the published one is kept.
    `skip_if_empty` (the scheduled deployment) completes without tuning while the lake has no
    prefix hashes yet."""
    try:
        result = tune_window_task(trace, data_dir, window, capacity, rounds, grid)
    except TraceError as err:
        if not (skip_if_empty and trace is None):
            raise
        get_run_logger().warning("nothing to tune on: %s", err)
        return {"skipped": str(err)}
    source = trace or str(Path(data_dir) / "lake")
    run_id = log_tuning_run(result, mlflow_uri, Path(mlflow_artifacts), source)
    publish_decay(result, data_dir, run_id)
    return {"run_id": run_id, "best": result["best"], "default": result["default"]}

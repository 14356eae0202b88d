"""Prefect flow `tune-decay`: tune the heat half-life on the latest window, log it to MLflow,
and write it where the cache runtime reads it (`<data_dir>/tuning/decay.json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from cache_runtime.heat import DecayParams
from flows.bench.traces import load_trace
from models.heat.tracking import log_tuning_run
from models.heat.tuning import tune_decay


def decay_params_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "tuning" / "decay.json"


@task(name="tune-decay-window")
def tune_window_task(
    trace: str, window: int, capacity: float, rounds: int, grid: int
) -> dict[str, Any]:
    loaded = load_trace(Path(trace), "mooncake").last_requests(window)
    entries = max(1, round(capacity * loaded.unique))
    return tune_decay(loaded.accesses, loaded.request_starts, loaded.times, entries, rounds, grid)


@flow(name="tune-decay")
def tune_decay_flow(
    trace: str,
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    window: int = 2000,
    capacity: float = 0.1,
    rounds: int = 10,
    grid: int = 40,
) -> dict[str, Any]:
    """Tune, log, publish. Only a result at least as good as the default is published (the
    tuner evaluates the default first, so its best never is worse)."""
    result = tune_window_task(trace, window, capacity, rounds, grid)
    run_id = log_tuning_run(result, mlflow_uri, Path(mlflow_artifacts), trace)
    best = result["best"]
    DecayParams(half_life_s=best["half_life_s"]).save(
        decay_params_path(data_dir), objective=best["objective"], mlflow_run_id=run_id
    )
    return {"run_id": run_id, "best": best, "default": result["default"]}

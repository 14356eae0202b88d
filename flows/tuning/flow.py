"""Prefect flow `tune-decay`: tune the heat half-life (and the priority weight, when the window's
requests have several priorities) on the latest window, log it to MLflow, and write both where
the cache runtime reads them (`<data_dir>/tuning/decay.json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from cache_runtime.heat import DecayParams, decay_params_path
from cache_runtime.traces import AccessTrace, TraceError, load_trace, trace_from_requests
from models.heat.tracking import log_tuning_run
from models.heat.tuning import tune_decay


def lake_trace(data_dir: str | Path) -> AccessTrace:
    """The lake's requests as a trace of KV pages, with their priorities (what the scheduled
    tuning runs on)."""
    from data_contracts.lake import Lake

    columns = ["timestamp", "prefix_hashes", "prompt_tokens", "priority"]
    return trace_from_requests(Lake(Path(data_dir) / "lake").read("requests", columns), "lake")


@task(name="tune-decay-window")
def tune_window_task(
    trace: str | None, data_dir: str, window: int, capacity: float, rounds: int, grid: int
) -> dict[str, Any]:
    full = load_trace(Path(trace), "mooncake") if trace else lake_trace(data_dir)
    loaded = full.last_requests(window)
    entries = max(1, round(capacity * loaded.unique))
    return tune_decay(
        loaded.accesses, loaded.request_starts, loaded.times, entries, rounds, grid,
        priorities=loaded.priorities,
    )  # fmt: skip


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
    best = result["best"]
    path = decay_params_path(data_dir)
    weight = best["priority_weight"]
    if weight is None:  # not searched on this window: keep what was published
        weight = DecayParams.load(path).priority_weight
    DecayParams(half_life_s=best["half_life_s"], priority_weight=weight).save(
        path, objective=best["objective"], mlflow_run_id=run_id
    )
    return {"run_id": run_id, "best": best, "default": result["default"]}

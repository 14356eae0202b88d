"""Prefect flow `check-drift`: latest requests vs the champion's training data -> MLflow -> retrain.

Each check leaves one MLflow run in the `preheat-drift` experiment, whatever it decides: the
windows compared, a score per column, the decision and its reason as tags, and the reports
(Evidently's HTML and JSON, and `result.json` with the decision) under `drift/`. On drift it
starts a run of the retrain deployment (`train-forecaster/<pool>`) without waiting for it, and
records that run's id in the MLflow run; the Prefect run carries the reason back (a tag and a
markdown artifact), so either side leads to the other.

The logic is in `models.drift`; this module reads the lake and the registry, logs and triggers.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.exceptions import MissingContextError

from data_contracts.lake import Lake
from models.drift import (
    COLUMN_THRESHOLDS,
    DEFAULT_THRESHOLD,
    METHODS,
    MIN_REQUESTS,
    RATE_BUCKET_S,
    REQUEST_COLUMNS,
    TOP_TEMPLATES,
    DriftResult,
    TrainingWindow,
    Windows,
    choose_windows,
    detect_drift,
    insufficient,
    request_features,
    write_reports,
)

EXPERIMENT = "preheat-drift"
RETRAIN_TAG = "drift-retrain"  # on the Prefect runs this flow starts
# The forecaster's registry names (`models.forecast.registry`), repeated rather than imported:
# that module pulls in torch and Lightning (~13 s here), which an hourly check should not pay.
# tests/integration/test_drift_flow.py registers through the registry's names, so a rename fails.
FORECASTER_MODEL, CHAMPION_ALIAS = "preheat-forecaster", "champion"


def champion_training_window(tracking_uri: str) -> tuple[TrainingWindow | None, str]:
    """The training window the champion forecaster's run recorded (`train_start`, `train_end`
    params), or (None, why not): no champion, or one trained before those params existed."""
    from mlflow import MlflowClient

    from models.tracking import alias_version

    client = MlflowClient(tracking_uri)
    version = alias_version(client, FORECASTER_MODEL, CHAMPION_ALIAS)
    if version is None:
        return None, f"no {FORECASTER_MODEL}@{CHAMPION_ALIAS} registered"
    label = f"{FORECASTER_MODEL} v{version.version} (run {version.run_id})"
    params = client.get_run(version.run_id).data.params
    if not params.get("train_start") or not params.get("train_end"):
        return None, f"{label} does not record its training window (train_start, train_end)"
    start, end = (_utc(params[key]) for key in ("train_start", "train_end"))
    return TrainingWindow(start, end, label), ""


def _utc(text: str) -> pd.Timestamp:
    stamp = pd.Timestamp(text)
    return stamp.tz_localize("UTC") if stamp.tz is None else stamp.tz_convert("UTC")


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:  # a task called as a plain function (`.fn`)
        return logging.getLogger(__name__)


def log_drift_run(
    result: DriftResult, windows: Windows, settings: dict[str, Any], uri: str, artifacts: Path
) -> str:
    """One MLflow run for one check: settings and windows as params, scores as metrics, the
    decision, its reason and the reference's origin as tags, the reports as artifacts."""
    import mlflow

    from models.tracking import experiment_id

    experiment = experiment_id(EXPERIMENT, uri, artifacts)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_params({**settings, **windows.bounds})
        mlflow.log_metrics(
            {
                "share_drifted": result.share_drifted,
                "reference_rows": result.reference_rows,
                "current_rows": result.current_rows,
                **{f"drift.{c.column}": c.score for c in result.columns},
            }
        )
        mlflow.set_tags(
            {"decision": result.decision, "reason": result.reason, "reference": windows.source}
        )
        write_reports(result, Path(tmp))
        mlflow.log_artifacts(tmp, artifact_path="drift")
    return run.info.run_id


def _in_flight(client: Any, deployment_id: Any) -> Any | None:
    """A run of the deployment that is due or running (not a future scheduled one), if any."""
    from prefect.client.schemas import filters
    from prefect.client.schemas.objects import StateType

    def runs(types: list[StateType], **extra: Any) -> list[Any]:
        state = filters.FlowRunFilterState(type=filters.FlowRunFilterStateType(any_=types))
        return client.read_flow_runs(
            flow_run_filter=filters.FlowRunFilter(state=state, **extra),
            deployment_filter=filters.DeploymentFilter(
                id=filters.DeploymentFilterId(any_=[deployment_id])
            ),
            limit=1,
        )

    # A nightly schedule keeps future runs SCHEDULED: only those already due count.
    due = filters.FlowRunFilterExpectedStartTime(before_=pd.Timestamp.now(tz="UTC"))
    found = runs([StateType.PENDING, StateType.RUNNING]) or runs(
        [StateType.SCHEDULED], expected_start_time=due
    )
    return found[0] if found else None


def trigger_retrain(deployment: str, reason: str, mlflow_run_id: str) -> dict[str, str]:
    """Start a run of `deployment` without waiting for it; returns `retrain` (triggered,
    already-in-flight or deployment-not-found), a message and the flow run's id when there is one.

    `as_subflow=False`: the retrain outlives this check and must not be cancelled with it, and a
    subflow link would leave a task of this run pending for as long as the retrain waits for a
    worker. The link is recorded instead (MLflow tag one way, a tag and an artifact the other);
    the idempotency key makes a retried check start no second retrain.
    """
    from prefect import get_client
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            target = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            return {
                "retrain": "deployment-not-found",
                "retrain_message": f"no deployment {deployment!r} (is `preheat serve` running?): "
                "retraining not triggered",
            }
        running = _in_flight(client, target.id)
        if running is not None:
            return {
                "retrain": "already-in-flight", "retrain_flow_run_id": str(running.id),
                "retrain_message": f"run {running.name} of {deployment} is already "
                f"{running.state_type.value.lower()}: no second retrain",
            }  # fmt: skip
    run = run_deployment(
        target.id, timeout=0, tags=[RETRAIN_TAG], as_subflow=False,
        idempotency_key=f"check-drift-{mlflow_run_id}",
    )  # fmt: skip
    note = (
        f"Retraining triggered by drift (MLflow run `{mlflow_run_id}`, {EXPERIMENT}).\n\n{reason}"
    )
    with get_client(sync_client=True) as client:
        client.create_artifact(
            ArtifactCreate(
                key="drift-reason", type="markdown", data=note, flow_run_id=run.id,
                description="Why the check-drift flow started this run",
            )
        )  # fmt: skip
    return {
        "retrain": "triggered", "retrain_flow_run_id": str(run.id),
        "retrain_message": f"started run {run.name} of {deployment}",
    }  # fmt: skip


@task(name="measure-drift")
def measure_drift_task(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, window_minutes: int,
    threshold: float, min_requests: int,
) -> dict[str, Any]:  # fmt: skip
    """Read the lake and the champion, compare the windows, log the MLflow run."""
    requests = Lake(Path(data_dir) / "lake").read("requests", columns=list(REQUEST_COLUMNS))
    training, why_none = champion_training_window(mlflow_uri)
    windows = choose_windows(request_features(requests), window_minutes, training, why_none)
    if windows.problem:
        result = insufficient(windows.problem, threshold, 0, len(windows.current))
    else:
        result = detect_drift(windows.reference, windows.current, threshold, min_requests)
    settings = {
        "window_minutes": window_minutes, "threshold": threshold, "min_requests": min_requests,
        "rate_bucket_s": RATE_BUCKET_S, "top_templates": TOP_TEMPLATES,
        "methods": json.dumps(METHODS), "column_thresholds": json.dumps(COLUMN_THRESHOLDS),
    }  # fmt: skip
    run_id = log_drift_run(result, windows, settings, mlflow_uri, Path(mlflow_artifacts))
    _logger().info("drift: %s: %s (MLflow run %s)", result.decision, result.reason, run_id)
    return {
        "decision": result.decision, "reason": result.reason, "drift": result.drift,
        "share_drifted": result.share_drifted, "drifted_columns": list(result.drifted_columns),
        "reference": windows.source, "mlflow_run_id": run_id,
    }  # fmt: skip


@task(name="retrain-on-drift")
def retrain_task(
    summary: dict[str, Any], deployment: str, trigger: bool, mlflow_uri: str
) -> dict[str, str]:
    """Trigger the retrain deployment on drift; record the outcome on the MLflow run either way
    (`retrain` tag: triggered, already-in-flight, deployment-not-found, disabled, not-needed)."""
    from mlflow import MlflowClient

    run_id = summary["mlflow_run_id"]
    if not summary["drift"]:
        outcome = {"retrain": "not-needed", "retrain_message": f"{summary['decision']}: no retrain"}
    elif not trigger:
        outcome = {"retrain": "disabled", "retrain_message": "drift, but trigger=False"}
    else:
        outcome = trigger_retrain(deployment, summary["reason"], run_id)
        outcome["retrain_deployment"] = deployment
        outcome["retrain_reason"] = summary["reason"]
    client = MlflowClient(mlflow_uri)
    for key, value in outcome.items():
        client.set_tag(run_id, key, value)
    _logger().info("retrain: %s", outcome["retrain_message"])
    return outcome


@flow(name="check-drift")
def check_drift_flow(
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    window_minutes: int = 60,
    threshold: float = DEFAULT_THRESHOLD,
    retrain_deployment: str = "train-forecaster/preheat",
    trigger: bool = True,
    min_requests: int = MIN_REQUESTS,
) -> dict[str, Any]:
    """Compare the latest `window_minutes` of requests with the champion forecaster's training
    data (its oldest window when there is no champion); on drift (a share of drifted columns of
    at least `threshold`), start `retrain_deployment` unless `trigger` is false.

    Returns the decision, the reason, the MLflow run id and the retrain outcome (`retrain`:
    triggered, already-in-flight, deployment-not-found, disabled, or not-needed).
    """
    summary = measure_drift_task(
        data_dir, mlflow_uri, mlflow_artifacts, window_minutes, threshold, min_requests
    )
    return {**summary, **retrain_task(summary, retrain_deployment, trigger, mlflow_uri)}

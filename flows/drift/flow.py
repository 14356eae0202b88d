"""Prefect flow `check-drift`: latest requests vs the champion's training data -> MLflow -> retrain.

Each check leaves one MLflow run in the `preheat-drift` experiment, whatever it decides
(`models.drift_tracking.check_lake_drift`: the windows, a score per column, the decision, its
reason and the reports). On drift it starts a run of the retrain deployment
(`train-forecaster/<pool>`) without waiting for it, and records that run's id in the MLflow run;
the Prefect run carries the reason back (a tag and a markdown artifact), so either side leads to
the other.

The logic is in `models.drift` and `models.drift_tracking`; this module triggers and records.
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.exceptions import MissingContextError

from models.drift import DEFAULT_THRESHOLD, MIN_REQUESTS
from models.drift_tracking import EXPERIMENT, check_lake_drift

RETRAIN_TAG = "drift-retrain"  # on the Prefect runs this flow starts


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:  # a task called as a plain function (`.fn`)
        return logging.getLogger(__name__)


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
    summary = check_lake_drift(
        data_dir, mlflow_uri, mlflow_artifacts, window_minutes, threshold, min_requests
    )
    _logger().info("drift: %s: %s (MLflow run %s)", summary["decision"], summary["reason"],
                   summary["mlflow_run_id"])  # fmt: skip
    return summary


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

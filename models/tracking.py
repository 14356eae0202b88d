"""The MLflow experiment every training or benchmark run of the platform logs into."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def experiment_id(name: str, tracking_uri: str, artifacts_dir: Path) -> str:
    """Get or create experiment `name` in the store at `tracking_uri`; sets it as the process's
    tracking URI (MLflow's fluent logging reads it). A new experiment keeps its artifacts under
    `artifacts_dir`, beside the store, not in whatever directory the process happens to run in."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    return str(mlflow.create_experiment(name, artifact_location=artifacts_dir.resolve().as_uri()))


def alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The `ModelVersion` that `name@alias` points at, or None when the model or the alias does
    not exist (the sqlalchemy store's codes for either); any other registry error raises."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as error:
        if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        return None

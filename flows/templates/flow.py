"""Prefect flow `mine-templates`: the lake's prompts -> `features/templates.parquet` + MLflow run.

Thin by design (house style): the task calls `models.templates.lake_mining.mine_lake`, which mines
each tenant's templates (ids kept stable against the previous table), writes the table, builds the
hotspot graph and the cross-session intents and logs it all to one MLflow run.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, task

from cache_runtime.settings import Settings
from models.templates.lake_mining import MineTemplatesParams, mine_lake


@task(name="mine-and-log-templates")
def mine_templates_task(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, params: dict[str, Any]
) -> dict[str, Any]:
    return mine_lake(data_dir, mlflow_uri, mlflow_artifacts, MineTemplatesParams(**params))


@flow(name="mine-templates")
def mine_templates_flow(
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    min_support: int = 5,
    eps: float = 0.35,
    method: str = "dbscan",
    top_k: int = 20,
) -> dict[str, Any]:
    """Mine each tenant's templates from the lake, write the table, log the run to MLflow."""
    params = MineTemplatesParams(min_support=min_support, eps=eps, method=method, top_k=top_k)
    return mine_templates_task(data_dir, mlflow_uri, mlflow_artifacts, asdict(params))


def mine_templates_now(settings: Settings, params: MineTemplatesParams) -> dict[str, Any]:
    """The CLI's path: the same task, called directly (no Prefect server needed)."""
    settings.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    return mine_templates_task.fn(
        str(settings.data_dir), settings.mlflow_uri, str(settings.mlflow_artifacts), asdict(params)
    )

"""Prefect flow `train-forecaster`: the lake's demand series -> MLflow run -> gated champion.

Thin by design (house style): the task calls `models.forecast.lake_training.train_on_lake`, which
reads the features the `features` flow wrote and calls `models.forecast.registry.train_and_register`
(the fitting, the evaluation on a held-out window, the logging and the alias decision).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, task

from cache_runtime.settings import Settings
from models.forecast.lake_training import TrainForecasterParams, train_on_lake


@task(name="train-and-register")
def train_task(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, params: dict[str, Any]
) -> dict[str, Any]:
    return train_on_lake(data_dir, mlflow_uri, mlflow_artifacts, TrainForecasterParams(**params))


@flow(name="train-forecaster")
def train_forecaster_flow(
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    granularity: str = "3min",
    top_k: int = 100,
    horizon: int = 6,
    epochs: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    """Train, evaluate against the champion and the baselines, register, move `champion` only
    when the new version wins (else the run says why not)."""
    params = TrainForecasterParams(
        granularity=granularity, top_k=top_k, horizon=horizon, epochs=epochs, seed=seed
    )
    return train_task(data_dir, mlflow_uri, mlflow_artifacts, asdict(params))


def train_forecaster(settings: Settings, params: TrainForecasterParams) -> dict[str, Any]:
    """The CLI's path: the same task, called directly (no Prefect server needed)."""
    settings.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    return train_task.fn(
        str(settings.data_dir), settings.mlflow_uri, str(settings.mlflow_artifacts), asdict(params)
    )

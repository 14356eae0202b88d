"""Prefect flow `train-heat-gan`: the lake's demand series -> the heat GAN -> MLflow, gated.

Thin by design (house style): the task calls `models.heat.lake_training.train_on_lake`, which
reads the features the `features` flow wrote and calls `models.heat.registry.train_and_register_gan`
(training, realism against the naive generator on held-back windows, logging, registration and
the `champion` decision).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, task

from cache_runtime.settings import Settings
from models.heat.lake_training import TrainHeatGanParams, train_on_lake


@task(name="train-and-register-heat-gan")
def train_heat_gan_task(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, params: dict[str, Any]
) -> dict[str, Any]:
    return train_on_lake(data_dir, mlflow_uri, mlflow_artifacts, TrainHeatGanParams(**params))


@flow(name="train-heat-gan")
def train_heat_gan_flow(
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    granularity: str = "3min",
    top_k: int = 100,
    horizon: int = 6,
    epochs: int = 30,
    seed: int = 0,
) -> dict[str, Any]:
    """Train, measure realism next to the naive generator, register, move `champion` only when
    the GAN's continuations are closer to the real ones (else the run says why not)."""
    params = TrainHeatGanParams(
        granularity=granularity, top_k=top_k, horizon=horizon, epochs=epochs, seed=seed
    )
    return train_heat_gan_task(data_dir, mlflow_uri, mlflow_artifacts, asdict(params))


def train_heat_gan(settings: Settings, params: TrainHeatGanParams) -> dict[str, Any]:
    """The CLI's path: the same task, called directly (no Prefect server needed)."""
    settings.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    return train_heat_gan_task.fn(
        str(settings.data_dir), settings.mlflow_uri, str(settings.mlflow_artifacts), asdict(params)
    )

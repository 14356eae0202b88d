"""Prefect flow `train-forecaster`: the lake's demand series -> MLflow run -> gated champion.

Thin by design (house style): the task reads the features the `features` flow wrote and calls
`models.forecast.registry.train_and_register`, which does the fitting, the evaluation on a
held-out window, the logging and the alias decision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task

from cache_runtime.settings import Settings
from data_contracts.demand import check_granularity
from data_contracts.derived import require_demand
from models.forecast.attention import AttentionConfig


@dataclass(frozen=True)
class TrainForecasterParams:
    """What a user may choose from the CLI or the Prefect UI."""

    granularity: str = "3min"
    top_k: int = 100
    recent: int = 48
    horizon: int = 6
    epochs: int = 20
    eval_frac: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        check_granularity(self.granularity)


@task(name="train-and-register")
def train_task(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, params: dict[str, Any]
) -> dict[str, Any]:
    from models.forecast.registry import train_and_register

    chosen = TrainForecasterParams(**params)
    demand = require_demand(Path(data_dir), chosen.granularity)
    config = AttentionConfig(horizon=chosen.horizon, epochs=chosen.epochs, seed=chosen.seed)
    return train_and_register(
        demand, mlflow_uri, Path(mlflow_artifacts), chosen.top_k, chosen.recent, config,
        chosen.eval_frac,
    )  # fmt: skip


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

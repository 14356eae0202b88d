"""Prefect flow `train-heat-gan`: the lake's demand series -> the heat GAN -> MLflow, gated.

Thin by design (house style): the task reads the features the `features` flow wrote and calls
`models.heat.registry.train_and_register_gan`, which trains, measures realism against the
naive generator on held-back windows, logs, registers and decides the `champion` alias.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task

from cache_runtime.settings import Settings
from data_contracts.demand import check_granularity
from data_contracts.derived import require_demand


@dataclass(frozen=True)
class TrainHeatGanParams:
    """What a user may choose from the CLI or the Prefect UI."""

    granularity: str = "3min"
    top_k: int = 100
    horizon: int = 6
    epochs: int = 30
    half_life_buckets: float = 2.0
    eval_frac: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        check_granularity(self.granularity)


@task(name="train-and-register-heat-gan")
def train_heat_gan_task(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, params: dict[str, Any]
) -> dict[str, Any]:
    from models.heat.gan import GanConfig
    from models.heat.registry import train_and_register_gan

    chosen = TrainHeatGanParams(**params)
    demand = require_demand(Path(data_dir), chosen.granularity)
    config = GanConfig(
        horizon=chosen.horizon, epochs=chosen.epochs,
        half_life_buckets=chosen.half_life_buckets, seed=chosen.seed,
    )  # fmt: skip
    return train_and_register_gan(
        demand, mlflow_uri, Path(mlflow_artifacts), config, chosen.top_k, chosen.eval_frac
    )


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

"""Training the per-key forecaster on the lake's demand series: the parameters a user may choose
(from the CLI or the Prefect UI) and the one call the `train-forecaster` flow's task makes.

`train_on_lake` reads the series the `features` flow wrote and calls
`models.forecast.registry.train_and_register`, which does the fitting, the evaluation on a
held-out window, the logging and the alias decision. No Prefect here: the flow
(`flows.forecast.flow`) runs it as its task, and the CLI calls that task's `.fn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def train_on_lake(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, chosen: TrainForecasterParams
) -> dict[str, Any]:
    """Train on the demand series of `chosen.granularity`, evaluate, register, gate `champion`;
    returns `train_and_register`'s summary."""
    from models.forecast.registry import train_and_register

    demand = require_demand(Path(data_dir), chosen.granularity)
    config = AttentionConfig(horizon=chosen.horizon, epochs=chosen.epochs, seed=chosen.seed)
    return train_and_register(
        demand, mlflow_uri, Path(mlflow_artifacts), chosen.top_k, chosen.recent, config,
        chosen.eval_frac,
    )  # fmt: skip

"""Training the heat GAN on the lake's demand series: the parameters a user may choose (from the
CLI or the Prefect UI) and the one call the `train-heat-gan` flow's task makes.

`train_on_lake` reads the series the `features` flow wrote and calls
`models.heat.registry.train_and_register_gan`, which trains, measures realism against the naive
generator on held-back windows, logs, registers and decides the `champion` alias. No Prefect
here: the flow (`flows.heat.flow`) runs it as its task, and the CLI calls that task's `.fn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def train_on_lake(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, chosen: TrainHeatGanParams
) -> dict[str, Any]:
    """Train on the demand series of `chosen.granularity`, measure realism, register, gate
    `champion`; returns `train_and_register_gan`'s summary."""
    from models.heat.gan import GanConfig
    from models.heat.registry import train_and_register_gan

    demand = require_demand(Path(data_dir), chosen.granularity)
    config = GanConfig(
        horizon=chosen.horizon, epochs=chosen.epochs,
        half_life_buckets=chosen.half_life_buckets, seed=chosen.seed,
    )  # fmt: skip
    return train_and_register_gan(
        demand, mlflow_uri, Path(mlflow_artifacts), config, chosen.top_k, chosen.eval_frac
    )

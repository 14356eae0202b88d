"""Train the heat GAN on the lake's demand, measure its realism, log and register it in MLflow.

Registered as `preheat-heat-gan`. The alias `champion` moves to a new version only when its
continuations beat the naive "repeat the last window + noise" generator's on the held-back
windows (energy score, the conditional proper score); a rejected version stays registered and
tagged with the numbers, so nobody simulates with a model that is worse than a one-liner.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
from pandera.typing import DataFrame

from data_contracts import DemandSeries
from models.forecast.panel import KeyPanel
from models.forecast.registry import git_commit, pip_requirements
from models.heat.gan import GanConfig, HeatGan, load_gan, save_gan, train_gan
from models.heat.realism import NaiveGenerator, compare
from models.heat.series import HeatSplit, decayed_heat
from models.tracking import alias_version, experiment_id

MODEL_NAME = "preheat-heat-gan"
EXPERIMENT = "preheat-heat-gan"
CHAMPION = "champion"
WEIGHTS_FILE = "heat_gan.pt"


@dataclass(frozen=True)
class HeatPanel:
    """One tenant's (or every tenant's) keys and their heat on one bucket grid."""

    tenants: list[str]
    keys: list[str]
    heat: np.ndarray  # (K, N) heat in requests
    starts: pd.DatetimeIndex  # (N,)
    granularity: str


def heat_panel(
    demand: DataFrame[DemandSeries], half_life_buckets: float, top_k: int = 100
) -> HeatPanel:
    """The top keys' (and each tenant's `__other__`) heat, from one granularity's demand."""
    panel = KeyPanel.from_demand(demand, top_k)
    return HeatPanel(
        [str(t) for t in panel.tenants],
        [str(k) for k in panel.keys],
        decayed_heat(panel.counts, half_life_buckets),
        panel.starts,
        panel.granularity,
    )


class HeatGanPyfunc(mlflow.pyfunc.PythonModel):
    """Rows of L history buckets (`h1`..`hL`, heat in requests) in, one sampled continuation
    (`c1`..`cT`) per row out; `params={"seed": n}` picks the noise."""

    def load_context(self, context: Any) -> None:
        self.module, self.meta = load_gan(Path(context.artifacts["heat_gan"]))

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        seed = int((params or {}).get("seed", 0))
        paths = self.module.sample(model_input.to_numpy(dtype=np.float32), 1, seed)[:, 0, :]
        return pd.DataFrame(paths, columns=[f"c{i + 1}" for i in range(paths.shape[1])])


def _log_model(directory: Path, module: HeatGan, meta: dict[str, Any]) -> Any:
    from mlflow.models import infer_signature

    columns = [f"h{i + 1}" for i in range(module.config.history)]
    example = pd.DataFrame(np.linspace(0, 3, module.config.history)[None, :], columns=columns)
    output = module.sample(example.to_numpy(dtype=np.float32), 1)[:, 0, :]
    signature = infer_signature(
        example,
        pd.DataFrame(output, columns=[f"c{i + 1}" for i in range(output.shape[1])]),
        params={"seed": 0},
    )
    return mlflow.pyfunc.log_model(
        name="model",
        python_model=HeatGanPyfunc(),
        artifacts={"heat_gan": str(directory / WEIGHTS_FILE)},
        signature=signature,
        input_example=example,
        pip_requirements=pip_requirements(),
        metadata=meta,
        registered_model_name=MODEL_NAME,
    )


def _sample_figure(module: HeatGan, split: HeatSplit, seed: int) -> Any:
    """Six held-back windows: history, the real continuation, and 16 generated ones."""
    from matplotlib.figure import Figure

    windows = split.held_back.subsample(6, seed)
    samples = module.sample(windows.history, 16, seed)  # (6, 16, T)
    figure = Figure(figsize=(10, 5))
    axes = figure.subplots(2, 3).ravel()
    past = np.arange(-windows.history.shape[1] + 1, 1)
    ahead = np.arange(1, windows.continuation.shape[1] + 1)
    for i, ax in enumerate(axes[: len(windows)]):
        ax.plot(past, windows.history[i], color="black")
        ax.plot(ahead, samples[i].T, color="tab:blue", alpha=0.25)
        ax.plot(ahead, windows.continuation[i], color="black", linestyle="--")
    figure.suptitle("Held-back windows: real (black) and generated (blue) continuations")
    return figure


def train_and_register_gan(
    demand: DataFrame[DemandSeries],
    tracking_uri: str,
    artifacts_dir: Path,
    config: GanConfig | None = None,
    top_k: int = 100,
    eval_frac: float = 0.25,
    paths: int = 16,
    max_train_windows: int = 20_000,
) -> dict[str, Any]:
    """Fit on the buckets before the held-back part, measure realism next to the naive
    generator on the rest, log one run, register, move `champion` only when the GAN wins.

    `max_train_windows`: train on a random sample of at most this many windows (the naive
    generator's spread is fitted on all of them). Returns run_id, version, promoted, reason and
    the realism numbers.
    """
    config = config or GanConfig()
    demand = DemandSeries.validate(demand, lazy=True)
    panel = heat_panel(demand, config.half_life_buckets, top_k)
    split = HeatSplit.build(panel.heat, config.history, config.horizon, eval_frac)
    # A bound on training time: the demo lake alone gives ~75k windows, and past ~20k more of
    # the same keys' windows adds little but minutes (measured on the demo: 2 min for 5 epochs).
    module = train_gan(split.train.subsample(max_train_windows, config.seed), config)
    naive = NaiveGenerator.fit(split.train)
    realism = compare(
        {"gan": module.sample, "naive": naive.sample}, split.held_back, paths, config.seed
    )
    promoted, reason = _verdict(realism)
    meta = {
        "granularity": panel.granularity, "top_k": top_k, "eval_frac": eval_frac,
        "keys": len(panel.keys), "buckets": panel.heat.shape[1],
        "train_windows": len(split.train), "held_back_windows": len(split.held_back),
        "naive_sigma": naive.sigma, "git_commit": git_commit(),
    }  # fmt: skip
    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient(tracking_uri)
    experiment = experiment_id(EXPERIMENT, tracking_uri, artifacts_dir)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_params({**{f"config.{k}": v for k, v in asdict(config).items()}, **meta})
        for name, numbers in realism["generators"].items():
            mlflow.log_metrics({f"{name}.{metric}": value for metric, value in numbers.items()})
        mlflow.log_dict(realism, "realism.json")
        mlflow.log_figure(_sample_figure(module, split, config.seed), "held_back_samples.png")
        save_gan(module, Path(tmp) / WEIGHTS_FILE, meta)
        info = _log_model(Path(tmp), module, meta)
    version = str(info.registered_model_version)
    _apply_decision(client, run.info.run_id, version, promoted, reason)
    return {
        "run_id": run.info.run_id, "version": version, "promoted": promoted, "reason": reason,
        "realism": realism, **meta,
    }  # fmt: skip


def _verdict(realism: dict[str, Any]) -> tuple[bool, str]:
    """(promoted, reason): the GAN is promoted only when its energy score on the held-back
    windows beats the naive generator's."""
    gan, baseline = realism["generators"]["gan"], realism["generators"]["naive"]
    promoted = gan["energy_score"] < baseline["energy_score"]
    reason = (
        f"energy score {gan['energy_score']} vs naive {baseline['energy_score']} on "
        f"{realism['windows']} held-back windows"
    )
    return promoted, reason


def _apply_decision(client: Any, run_id: str, version: str, promoted: bool, reason: str) -> None:
    """Tag the run and the version with the decision and its reason; move `champion` to the
    version only when it is promoted (a rejected one stays registered, tagged)."""
    tags = {"promotion": "promoted" if promoted else "rejected", "promotion_reason": reason}
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
        client.set_model_version_tag(MODEL_NAME, version, key, value)
    if promoted:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION, version)


def load_champion_gan(
    tracking_uri: str, alias: str = CHAMPION
) -> tuple[HeatGan, dict[str, Any], str]:
    """(module, metadata, version) of `preheat-heat-gan@alias`; `LookupError` when missing."""
    mlflow.set_tracking_uri(tracking_uri)
    version = alias_version(mlflow.MlflowClient(tracking_uri), MODEL_NAME, alias)
    if version is None:
        raise LookupError(
            f"no {MODEL_NAME}@{alias} registered in {tracking_uri}: run `preheat train heat-gan`"
        )
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@{alias}")
    wrapper = model.unwrap_python_model()
    return wrapper.module, dict(wrapper.meta), str(version.version)

"""MLflow tracking, registry, champion gating and loading of the per-key forecaster.

A fitted `PanelForecaster` is saved as a self-describing directory (`saved.py`), wrapped as an
MLflow pyfunc and registered as `preheat-forecaster`. The alias `champion` moves to a new version
only when it beats the current champion on the same evaluation window, is no worse than the
best per-key baseline there, and does not make the warm-up planner's hot set recall
significantly fewer requests than it does today; a rejected version stays registered, tagged
with the numbers.

The registered model is the one fitted on the train part, i.e. exactly what the gate measured.
Rejected: refitting on every bucket after gating, because the registry would then hold a model
nobody evaluated. It loses little: a forecast reads the latest history as its input, so the
model only misses the evaluation window as *training* data.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
from pandera.typing import DataFrame

from data_contracts import DemandSeries, KeyForecast
from models.forecast.attention import AttentionConfig
from models.forecast.gating import (
    HotSetComparison,
    PredictFn,
    WindowActuals,
    bucket_width,
    promotion_decision,
    rolling_forecasts,
    tail_coverage_on_window,
    window_mae,
)
from models.forecast.panel import (
    PANEL_BASELINES,
    DemandGrid,
    KeyPanel,
    PanelForecaster,
)
from models.forecast.saved import (
    META_FILE,
    WEIGHTS_FILE,
    git_commit,
    load_panel_forecaster,
    save_panel_forecaster,
)
from models.tracking import alias_version
from models.warmup.hot_set import recall_on_window

__all__ = [
    "CHAMPION",
    "EXPERIMENT",
    "META_FILE",
    "MODEL_NAME",
    "REQUIREMENTS",
    "WEIGHTS_FILE",
    "Champion",
    "ForecasterPyfunc",
    "git_commit",
    "load_champion",
    "load_panel_forecaster",
    "pip_requirements",
    "save_panel_forecaster",
    "to_model_input",
    "train_and_register",
]

MODEL_NAME = "preheat-forecaster"
EXPERIMENT = "preheat-forecaster"
CHAMPION = "champion"
REQUIREMENTS = ("torch", "pytorch-lightning", "pandas", "pandera", "numpy", "pyarrow", "mlflow")


def to_model_input(frame: pd.DataFrame) -> pd.DataFrame:
    """A DemandSeries or KeyForecast frame as the pyfunc takes and gives it: naive UTC starts.

    MLflow's schema enforcement refuses tz-aware datetimes (measured with 3.17.2); outputs go
    naive too, so the signature describes both sides as they are. Arrow strings pass unchanged.
    """
    frame = frame.copy()
    if frame["bucket_start"].dt.tz is not None:
        frame["bucket_start"] = frame["bucket_start"].dt.tz_convert("UTC").dt.tz_localize(None)
    return frame


def _utc(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    if frame["bucket_start"].dt.tz is None:
        frame["bucket_start"] = frame["bucket_start"].dt.tz_localize("UTC")
    return frame


class ForecasterPyfunc(mlflow.pyfunc.PythonModel):
    """DemandSeries rows of one granularity in, the `KeyForecast` after them out (naive UTC).

    The class is pickled by reference, so loading needs this package installed. Rejected:
    `code_paths` copies of the package, which would shadow the installed one at load time.
    """

    def load_context(self, context: Any) -> None:
        self.forecaster, self.top_k, self.recent, self.meta = load_panel_forecaster(
            Path(context.artifacts["forecaster"])
        )

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        panel = KeyPanel.from_demand(_utc(model_input), self.top_k, self.recent)
        return to_model_input(self.forecaster.forecast(panel))


@dataclass
class Champion:
    """A registered forecaster loaded by alias, behind the per-key prediction call."""

    name: str
    version: str
    run_id: str
    meta: dict[str, Any]
    model: Any  # mlflow.pyfunc.PyFuncModel

    @property
    def horizon(self) -> int:
        return int(self.meta["config"]["horizon"])

    @property
    def forecaster(self) -> PanelForecaster:
        """The fitted model behind the pyfunc, to forecast a panel of other settings."""
        return self.model.unwrap_python_model().forecaster

    def predict_per_key(self, demand: DataFrame[DemandSeries]) -> DataFrame[KeyForecast]:
        """The `KeyForecast` after `demand`'s last bucket, validated on the way out."""
        return KeyForecast.validate(_utc(self.model.predict(to_model_input(demand))), lazy=True)


def load_champion(tracking_uri: str, name: str = MODEL_NAME, alias: str = CHAMPION) -> Champion:
    """Load `models:/<name>@<alias>`; `LookupError` when the model or the alias does not exist.

    Sets the process-wide tracking URI: MLflow resolves `models:/` URIs through it.
    """
    mlflow.set_tracking_uri(tracking_uri)
    version = alias_version(mlflow.MlflowClient(tracking_uri), name, alias)
    if version is None:
        raise LookupError(f"no {name}@{alias} registered in {tracking_uri}")
    model = mlflow.pyfunc.load_model(f"models:/{name}@{alias}")
    meta = model.unwrap_python_model().meta
    return Champion(name, str(version.version), str(version.run_id), meta, model)


def pip_requirements() -> list[str]:
    """The serving environment pinned to what trained the model (no ~10 s inference by MLflow)."""
    return [f"{name}=={metadata.version(name)}" for name in REQUIREMENTS]


def _split(
    demand: pd.DataFrame, horizon: int, eval_frac: float
) -> tuple[pd.DataFrame, pd.DatetimeIndex]:
    """(rows before the evaluation window, the window's origins): the fit never sees the window."""
    width = bucket_width(demand)
    starts = pd.date_range(demand["bucket_start"].min(), demand["bucket_start"].max(), freq=width)
    eval_start = int(len(starts) * (1 - eval_frac))
    origins = starts[eval_start : len(starts) - horizon + 1]
    if eval_start < 1 or len(origins) == 0:
        raise ValueError(
            f"{len(starts)} buckets leave no evaluation origin for eval_frac {eval_frac} "
            f"and horizon {horizon}"
        )
    return demand[demand["bucket_start"] < starts[eval_start]].reset_index(drop=True), origins


def _panel_predictor(forecaster: PanelForecaster, top_k: int, recent: int) -> PredictFn:
    def predict_fn(past: DemandGrid, origin: pd.Timestamp) -> pd.DataFrame:
        # only the buckets the forecast reads: at 5 s the whole past is 26-35k of them
        return forecaster.forecast(past.panel(top_k, recent, origin, forecaster.history))

    return predict_fn


def _predictors(
    forecaster: PanelForecaster, top_k: int, recent: int, champion: Champion | None
) -> dict[str, PredictFn]:
    """Candidate, per-key baselines (the candidate's fitted EWMA alpha) and the champion, all on
    the candidate's panel (its `top_k` and `recent`). The champion too: the window's error sums
    over a partition of each tenant's traffic, and a model judged on its own, smaller top K
    faces a coarser, easier one (`evaluate_on_window`): on the demo's lake the demo's top-20
    champion scored 7.51 on its own panel and 10.42 on a top-100 candidate's (which scored
    10.33)."""
    predictors = {"candidate": _panel_predictor(forecaster, top_k, recent)}
    for method in PANEL_BASELINES:
        baseline = PanelForecaster(config=forecaster.config, chosen=method, alpha=forecaster.alpha)
        predictors[method] = _panel_predictor(baseline, top_k, recent)
    if champion is not None:
        predictors["champion"] = _panel_predictor(champion.forecaster, top_k, recent)
    return predictors


def _forecast_figure(
    forecasts: Sequence[pd.DataFrame], actuals: WindowActuals, origins: pd.DatetimeIndex
) -> Any:
    """Step-1 demand of the forecast's top keys (all of them, `__other__` left out) per origin."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state, Agg on save

    rows = [actuals.allocate(f, o, 1) for f, o in zip(forecasts, origins, strict=True)]
    figure = Figure(figsize=(8, 4))
    axes = figure.subplots()
    axes.plot(origins, [r.actual[r.named].sum() for r in rows], label="actual", color="black")
    axes.plot(
        origins, [r.predicted[r.named].sum() for r in rows], label="predicted", linestyle="--"
    )
    axes.set_title("Top keys, one bucket ahead, over the evaluation window")
    axes.set_ylabel("requests per bucket")
    axes.legend()
    figure.autofmt_xdate()
    return figure


def _log_model(
    directory: Path, forecaster: PanelForecaster, meta: dict[str, Any], example: pd.DataFrame
) -> Any:
    """Log and register the saved forecaster; the signature comes from a real input's output."""
    from mlflow.models import infer_signature

    panel = KeyPanel.from_demand(_utc(example), meta["top_k"], meta["recent"])
    with warnings.catch_warnings():
        # MLflow's hint that integer columns cannot hold missing values: `step` never does.
        warnings.filterwarnings("ignore", "Hint: Inferred schema contains integer", UserWarning)
        signature = infer_signature(example, to_model_input(forecaster.forecast(panel)))
    return mlflow.pyfunc.log_model(
        name="model",
        python_model=ForecasterPyfunc(),
        artifacts={"forecaster": str(directory)},
        signature=signature,
        input_example=example,
        pip_requirements=pip_requirements(),
        metadata=meta,
        registered_model_name=MODEL_NAME,
    )


def _experiment_id(client: Any, artifacts_dir: Path) -> str:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        return str(experiment.experiment_id)
    artifacts_dir.mkdir(parents=True, exist_ok=True)  # beside the store, not in the cwd
    return str(
        client.create_experiment(EXPERIMENT, artifact_location=artifacts_dir.resolve().as_uri())
    )


def _apply_decision(client: Any, run_id: str, version: str, promoted: bool, reason: str) -> None:
    tags = {"promotion": "promoted" if promoted else "rejected", "promotion_reason": reason}
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
        client.set_model_version_tag(MODEL_NAME, version, key, value)
    if promoted:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION, version)


def _log_run(
    client: Any,
    artifacts_dir: Path,
    forecaster: PanelForecaster,
    rows: tuple[int, int],
    extra_params: dict[str, Any],
    eval_mae: dict[str, float],
    figure: Any,
    example: pd.DataFrame,
) -> tuple[str, str]:
    """One run: params (the saved metadata, so run and model agree), metrics, plot, model."""
    granularity = str(example["granularity"].iloc[0])
    with (
        tempfile.TemporaryDirectory() as tmp,
        mlflow.start_run(experiment_id=_experiment_id(client, artifacts_dir)) as run,
    ):
        meta = save_panel_forecaster(forecaster, Path(tmp) / "forecaster", *rows, granularity)
        config = {f"config.{k}": v for k, v in meta["config"].items()}
        nested = ("config", "validation_mae", "weights", "hedge")
        params = {k: v for k, v in meta.items() if k not in nested}
        mlflow.log_params({**config, **params, **extra_params})
        mlflow.log_metrics({f"eval_mae.{k}": v for k, v in eval_mae.items()})
        mlflow.log_metrics({f"validation_mae.{k}": v for k, v in meta["validation_mae"].items()})
        mlflow.log_metrics({f"weight.{k}": v for k, v in meta["weights"].items()})
        mlflow.log_figure(figure, "forecast_vs_actual.png")
        info = _log_model(Path(tmp) / "forecaster", forecaster, meta, to_model_input(example))
    return run.info.run_id, str(info.registered_model_version)


def _current_champion(tracking_uri: str) -> Champion | None:
    try:
        return load_champion(tracking_uri)
    except LookupError:
        return None


def train_and_register(
    demand: DataFrame[DemandSeries],
    tracking_uri: str,
    artifacts_dir: Path,
    top_k: int = 100,
    recent: int = 48,
    config: AttentionConfig | None = None,
    eval_frac: float = 0.25,
    client: Any = None,
    forecaster: PanelForecaster | None = None,
) -> dict[str, Any]:
    """Fit on the buckets before the evaluation window, judge, log one run, register, gate.

    The candidate, the current champion and the per-key baselines are all scored with
    `evaluate_on_window` on the same window (the last `eval_frac` of the buckets), at the
    shorter of the candidate's and the champion's horizons. `client`: an `MlflowClient` for
    the store at `tracking_uri` (a default one is made); logging itself goes through MLflow's
    fluent API, which is the only way to log a pyfunc. `forecaster`: the unfitted forecaster to
    fit (default `PanelForecaster(config)`; its own config wins), a seam for tests that need a
    known-bad candidate.

    The same forecasts also judge what the candidate makes of the warm-up planner's hot set
    against the champion (`_hot_set_recall`), which the promotion requires too.

    Returns run_id, version, promoted, reason, eval_mae (per method), chosen, tail_coverage and
    hotset_recall (per `recall_on_window` figure; empty when the window cannot judge it).
    """
    demand = DemandSeries.validate(demand, lazy=True)
    forecaster = forecaster or PanelForecaster(config or AttentionConfig())
    horizon = forecaster.config.horizon
    mlflow.set_tracking_uri(tracking_uri)
    client = client or mlflow.MlflowClient(tracking_uri)
    train, origins = _split(demand, horizon, eval_frac)
    grid = DemandGrid.of(demand)  # every model's rolling forecasts read it
    forecaster.fit(grid.before(origins[0]).panel(top_k, recent, until=origins[0]))
    champion = _current_champion(tracking_uri)
    horizon = horizon if champion is None else min(horizon, champion.horizon)
    forecasts = {
        name: rolling_forecasts(fn, grid, origins)
        for name, fn in _predictors(forecaster, top_k, recent, champion).items()
    }
    actuals = WindowActuals(grid)
    eval_mae = {name: window_mae(f, actuals, origins, horizon) for name, f in forecasts.items()}
    best_baseline = min(eval_mae[method] for method in PANEL_BASELINES)
    tail = tail_coverage_on_window(forecasts["candidate"], actuals, origins, horizon)
    hot_recall, hot_note = _hot_set_recall(
        forecasts, demand, grid, origins, champion, top_k, recent
    )
    hot_means = {name: float(recall.mean()) for name, recall in hot_recall.items()}
    promoted, reason = promotion_decision(
        eval_mae["candidate"],
        eval_mae.get("champion"),
        best_baseline,
        _hot_set_pair(hot_recall, champion),
    )
    params = _run_params(train, eval_frac, horizon, origins, champion)
    figure = _forecast_figure(forecasts["candidate"], actuals, origins)
    run_id, version = _log_run(
        client, artifacts_dir, forecaster, (top_k, recent), params, eval_mae, figure,
        _input_example(train),
    )  # fmt: skip
    if np.isfinite(tail):
        client.log_metric(run_id, "tail_coverage", tail)
    for name, recall in hot_means.items():
        client.log_metric(run_id, f"hotset_recall.{name}", recall)
    if hot_note:
        client.set_tag(run_id, "hotset_recall", hot_note)
    _apply_decision(client, run_id, version, promoted, reason)
    return dict(
        run_id=run_id, version=version, promoted=promoted, reason=reason, eval_mae=eval_mae,
        chosen=forecaster.chosen, tail_coverage=tail, hotset_recall=hot_means,
    )  # fmt: skip


def _hot_set_recall(
    forecasts: dict[str, list[pd.DataFrame]],
    demand: pd.DataFrame,
    grid: DemandGrid,
    origins: pd.DatetimeIndex,
    champion: Champion | None,
    top_k: int,
    recent: int,
) -> tuple[dict[str, np.ndarray], str | None]:
    """The planner's hot-set recall at each origin of the window with the candidate, and with
    the champion, as its learned expert (`recall_on_window`), or no figures and why the window
    cannot say (e.g. too few buckets before it). The champion forecasts its own keys here (its
    `top_k` and `recent`, as the planner runs it), not the candidate's panel the error is judged
    on: a champion of a smaller top K names fewer keys at plan time."""
    learned: dict[str, Sequence[pd.DataFrame]] = {"candidate": forecasts["candidate"]}
    try:
        if champion is not None and champion.forecaster.fit_end:  # else the planner leaves it out
            own = (int(champion.meta["top_k"]), int(champion.meta["recent"]))
            learned["champion"] = (
                forecasts["champion"]
                if own == (top_k, recent)
                else rolling_forecasts(_panel_predictor(champion.forecaster, *own), grid, origins)
            )
        return recall_on_window(demand, learned, origins), None
    except ValueError as err:
        return {}, f"not judged: {err}"


def _hot_set_pair(
    recall: dict[str, np.ndarray], champion: Champion | None
) -> HotSetComparison | None:
    """The planner's recall with the candidate against what it runs today: the champion, or no
    learned expert for a champion saved without the end of its training, which the planner
    leaves out. None without a champion or figures."""
    if champion is None or not recall:
        return None
    today = "planner_with_champion" if champion.forecaster.fit_end else "frequency"
    return HotSetComparison(recall["planner_with_candidate"], recall[today])


def _run_params(
    train: pd.DataFrame,
    eval_frac: float,
    horizon: int,
    origins: pd.DatetimeIndex,
    champion: Champion | None,
) -> dict[str, Any]:
    """The run's params beside the forecaster's own: how it was evaluated (window, horizon,
    origins, the champion it met) and which buckets it was trained on."""
    return {
        "eval_frac": eval_frac, "eval_horizon": horizon, "eval_origins": len(origins),
        "train_buckets": train["bucket_start"].nunique(),
        # [start, end) of the demand it learned from, up to the window (idle buckets before
        # it included, as in the model's `fit_end`): the `check-drift` flow's reference
        "train_start": train["bucket_start"].min().isoformat(),
        "train_end": origins[0].isoformat(),
        "champion_version": None if champion is None else champion.version,
        "tail_tolerance": "max(1, 0.5 x actual) over the horizon",
    }  # fmt: skip


def _input_example(train: pd.DataFrame) -> pd.DataFrame:
    """A real input: the train part's last few buckets (small, since it is stored with the
    model)."""
    return train[train["bucket_start"] > train["bucket_start"].max() - 4 * bucket_width(train)]

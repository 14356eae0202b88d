"""The forecaster in a real MLflow store: register, gate, load by alias, predict.

The gating sequence runs on steady demand (every key the same count in every bucket) so each
decision is forced rather than a property of noise: every baseline is exact there, a fitted
candidate ties them at zero error, and a known-bad candidate (an untrained attention module,
which survives saving and loading, so the registry holds exactly what was judged) loses to any
of them. The generated log checks the same path on realistic traffic.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import torch

from data_contracts import DemandSeries, KeyForecast
from data_contracts.lake import Lake
from models.features.demand import TOTAL_KEY, demand_series
from models.forecast.attention import AttentionConfig, ForecastModule
from models.forecast.gating import promotion_decision
from models.forecast.panel import OTHER_KEY, PANEL_BASELINES, KeyPanel, PanelForecaster
from models.forecast.registry import (
    CHAMPION,
    MODEL_NAME,
    load_champion,
    train_and_register,
)
from models.ingest.pipeline import ingest_file

pytestmark = pytest.mark.integration

LEARNED_ALONE = ("frequency", "candidate", "planner_with_candidate")
CONFIG = AttentionConfig(epochs=3, context=8, scales=(1, 2, 4), horizon=3)
START = pd.Timestamp("2024-03-04T00:00:00Z")
STEADY = {  # tenant -> key -> requests per 3 min bucket; totals include unkeyed requests
    "acme": {"template:a": 6.0, "template:b": 3.0, "template:c": 1.0, TOTAL_KEY: 12.0},
    "globex": {"template:x": 4.0, "template:y": 2.0, TOTAL_KEY: 7.0},
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """A fresh sqlite store; the process-wide tracking URI is put back afterwards."""
    before = mlflow.get_tracking_uri()
    yield f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(before)


def steady_demand(buckets: int = 40) -> pd.DataFrame:
    rows = [
        (tenant, key, "3min", START + t * pd.Timedelta(minutes=3), count)
        for tenant, keys in STEADY.items()
        for key, count in keys.items()
        for t in range(buckets)
    ]
    columns = ["tenant", "key", "granularity", "bucket_start", "count"]
    return DemandSeries.validate(pd.DataFrame(rows, columns=columns), lazy=True)


class UntrainedAttention(PanelForecaster):
    """Fits as usual, then answers with an untrained attention module: a known-bad candidate."""

    def fit(self, panel: KeyPanel, until: int | None = None) -> UntrainedAttention:
        super().fit(panel, until)
        torch.manual_seed(1)
        self.chosen, self.module = "attention", ForecastModule(self.config).eval()
        return self


def _tags(client: mlflow.MlflowClient, result: dict) -> tuple[dict, dict]:
    run = client.get_run(result["run_id"]).data.tags
    version = client.get_model_version(MODEL_NAME, result["version"]).tags
    return run, version


def test_gating_promotes_rejects_and_moves_the_alias(store: str, tmp_path: Path) -> None:
    client = mlflow.MlflowClient(store)
    demand = steady_demand()
    register = dict(tracking_uri=store, artifacts_dir=tmp_path / "art", top_k=3, recent=12)
    with pytest.raises(LookupError, match=f"no {MODEL_NAME}@{CHAMPION} registered"):
        load_champion(store)

    first = train_and_register(demand, config=CONFIG, client=client, **register)
    assert (first["version"], first["promoted"]) == ("1", True)
    assert first["reason"].startswith("promoted: first champion")
    assert first["eval_mae"]["candidate"] == 0.0 and "champion" not in first["eval_mae"]
    assert first["tail_coverage"] == 1.0  # steady demand: every tail key exactly right
    # steady demand, five keys, K 50: the planner's hot set holds every request; the model
    # alone names its top 3 (template:a, x, b: 13 of the 16 keyed requests of a bucket)
    assert first["hotset_recall"] == {**dict.fromkeys(LEARNED_ALONE, 1.0), "candidate": 13 / 16}
    assert "hot-set recall" not in first["reason"]  # no champion to compare with
    champion = load_champion(store)
    forecast = champion.predict_per_key(demand)
    assert champion.version == "1" and len(forecast) == (3 + 2) * CONFIG.horizon
    allocated = forecast.groupby(["tenant", "key"])["predicted"].unique().to_dict()
    assert allocated[("acme", "template:a")] == [6.0]
    assert allocated[("acme", OTHER_KEY)] == [3.0]  # template:c (1) + 2 unkeyed
    assert forecast["bucket_start"].min() == demand["bucket_start"].max() + pd.Timedelta("3min")

    worse = train_and_register(demand, forecaster=UntrainedAttention(CONFIG), **register)
    assert (worse["version"], worse["promoted"], worse["chosen"]) == ("2", False, "attention")
    assert worse["eval_mae"]["champion"] == 0.0 < worse["eval_mae"]["candidate"]
    assert "not better than the champion" in worse["reason"]
    recall = worse["hotset_recall"]
    assert set(recall) == {*LEARNED_ALONE, "champion", "planner_with_champion"}
    # the untrained model forecasts the panel's keys badly, but names the same three
    assert recall["champion"] == recall["candidate"] == 13 / 16
    assert recall["planner_with_champion"] == recall["planner_with_candidate"] == 1.0
    assert f"today {recall['planner_with_champion']:.4f}" in worse["reason"]
    metrics = client.get_run(worse["run_id"]).data.metrics
    assert {f"hotset_recall.{name}": value for name, value in recall.items()} == {
        name: value for name, value in metrics.items() if name.startswith("hotset_recall.")
    }
    for tags in _tags(client, worse):
        assert tags["promotion"] == "rejected" and tags["promotion_reason"] == worse["reason"]
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"

    # An operator pins the bad version; the next fitted candidate beats it and takes the alias.
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, worse["version"])
    better = train_and_register(demand, config=CONFIG, **register)
    assert (better["version"], better["promoted"]) == ("3", True)
    # Judged through MLflow, the pinned champion scores what it scored in-process when it was new.
    assert better["eval_mae"]["champion"] == pytest.approx(worse["eval_mae"]["candidate"])
    assert better["reason"].startswith("promoted: beats the champion")
    assert all(tags["promotion"] == "promoted" for tags in _tags(client, better))
    assert load_champion(store).version == "3"


def test_the_hot_set_is_judged_with_the_champion_s_own_keys(store: str, tmp_path: Path) -> None:
    """The planner runs the champion on its own top K: a top-1 champion names template:a alone
    (6 of a bucket's 16 keyed requests), even when judged beside a top-3 candidate."""
    client = mlflow.MlflowClient(store)
    demand = steady_demand()
    register = dict(tracking_uri=store, artifacts_dir=tmp_path / "art", recent=12, config=CONFIG)
    top_one = train_and_register(demand, top_k=1, **register)
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, top_one["version"])  # pinned

    result = train_and_register(demand, top_k=3, **register)

    assert result["hotset_recall"]["champion"] == 6 / 16
    assert result["hotset_recall"]["candidate"] == 13 / 16


def test_the_fit_and_the_gate_count_the_idle_buckets_before_the_window(
    store: str, tmp_path: Path
) -> None:
    """40 steady buckets, the window the last 10; buckets 28 and 29 saw no request. The model
    learns up to the window (its `fit_end`, the run's `train_end`), and the last value at the
    window's first origin is bucket 29's: nothing, at every step. Read from the last request
    (bucket 27, what the gate did), it was exact."""
    demand = steady_demand()
    idle = START + pd.Timedelta(minutes=3) * 28
    demand = demand[~demand["bucket_start"].between(idle, idle + pd.Timedelta(minutes=3))]
    window = START + pd.Timedelta(minutes=3) * 30
    register = dict(tracking_uri=store, artifacts_dir=tmp_path / "art", recent=12, config=CONFIG)

    result = train_and_register(demand.reset_index(drop=True), top_k=3, **register)

    params = mlflow.MlflowClient(store).get_run(result["run_id"]).data.params
    assert params["train_end"] == window.isoformat()
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}/{result['version']}")
    assert model.unwrap_python_model().forecaster.fit_end == window.isoformat()
    # per (tenant, step), 2 tenants x 3 steps x 8 origins: the first origin misses each
    # tenant's whole demand at each step (acme 12, globex 7), the others are exact
    assert result["eval_mae"]["last_value"] == pytest.approx((12 + 7) * 3 / 48)


def test_a_lake_without_named_keys_is_registered_without_a_hot_set(
    store: str, tmp_path: Path
) -> None:
    client = mlflow.MlflowClient(store)
    demand = steady_demand()
    totals = demand[demand["key"] == TOTAL_KEY].reset_index(drop=True)

    result = train_and_register(
        totals, store, tmp_path / "art", top_k=3, recent=12, config=CONFIG, client=client
    )

    assert result["hotset_recall"] == {}
    note = client.get_run(result["run_id"]).data.tags["hotset_recall"]
    assert note == "not judged: no requests of named keys, or no origin, to judge a hot set on"


def test_generated_log_is_tracked_registered_and_served(
    store: str, tmp_path: Path, small_log: Path, lake: Lake
) -> None:
    ingest_file(small_log, lake)
    demand = demand_series(lake.read("requests"), ["3min"])["3min"]
    client = mlflow.MlflowClient(store)

    result = train_and_register(
        demand, store, tmp_path / "art", top_k=10, recent=12, config=CONFIG, client=client
    )

    best = min(result["eval_mae"][m] for m in PANEL_BASELINES)
    assert (result["promoted"], result["reason"]) == promotion_decision(
        result["eval_mae"]["candidate"], None, best
    )
    run = client.get_run(result["run_id"])
    assert run.data.params["granularity"] == "3min" and run.data.params["git_commit"]
    assert run.data.params["chosen"] == result["chosen"]
    assert {f"eval_mae.{m}" for m in ("candidate", *PANEL_BASELINES)} <= set(run.data.metrics)
    assert f"validation_mae.{result['chosen']}" in run.data.metrics
    assert run.data.metrics["tail_coverage"] == pytest.approx(result["tail_coverage"])
    assert 0.0 <= result["tail_coverage"] <= 1.0
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert "forecast_vs_actual.png" in artifacts
    assert all(tags["promotion_reason"] == result["reason"] for tags in _tags(client, result))

    client.set_registered_model_alias(MODEL_NAME, CHAMPION, result["version"])
    forecast = load_champion(store).predict_per_key(demand)
    KeyForecast.validate(forecast)
    assert forecast["tenant"].nunique() == demand["tenant"].nunique()
    assert len(forecast) == (10 + demand["tenant"].nunique()) * CONFIG.horizon


class RegisteredAgain(PanelForecaster):
    """ "Fits" by taking a fitted forecaster's state: the same model registered again."""

    def __init__(self, fitted: PanelForecaster) -> None:
        super().__init__(fitted.config)
        self._fitted = fitted

    def fit(self, panel: KeyPanel, until: int | None = None) -> RegisteredAgain:
        for name, value in vars(self._fitted).items():
            setattr(self, name, value)
        return self


def test_a_champion_of_another_top_k_is_judged_on_the_candidate_s_keys(
    store: str, tmp_path: Path, small_log: Path, lake: Lake
) -> None:
    """The window's error sums over a partition of each tenant's traffic, so fewer keys make a
    smaller error: scored on its own top 2, the champion would beat itself at top 10."""
    ingest_file(small_log, lake)
    demand = demand_series(lake.read("requests"), ["3min"])["3min"]
    register = dict(tracking_uri=store, artifacts_dir=tmp_path / "art", recent=12)
    first = train_and_register(demand, top_k=2, config=CONFIG, **register)
    mlflow.MlflowClient(store).set_registered_model_alias(MODEL_NAME, CHAMPION, first["version"])

    same = RegisteredAgain(load_champion(store).forecaster)
    again = train_and_register(demand, top_k=10, forecaster=same, **register)

    assert again["eval_mae"]["champion"] == again["eval_mae"]["candidate"]
    assert "not better than the champion" in again["reason"]

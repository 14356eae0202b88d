"""`check-drift` on a real Prefect API and a real MLflow store: reports, decision, retraining.

The retrain deployment is a stand-in flow named `train-forecaster`, deployed to a process pool
like `preheat serve` deploys the real one; no worker runs, so a triggered run stays scheduled
and can be read back through the Prefect client. The lakes are two generated hours around the
afternoon peak (the daily tide is symmetric there, so the first and the last hour are alike);
the drifted one has longer prompts and a reshuffled template popularity in its second hour.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import mlflow
import orjson
import pandas as pd
import pytest
from prefect import flow

from data_contracts.lake import Lake
from flows.drift.flow import RETRAIN_TAG, check_drift_flow
from models.ingest.pipeline import ingest_file
from models.ingest.synthetic import SyntheticLogSpec, generate_requests

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "drift-test"
RETRAIN = f"train-forecaster/{POOL}"
PEAK = pd.Timestamp("2024-03-04T14:00:00Z")


@flow(name="train-forecaster")
def stand_in_train_forecaster(data_dir: str = "data") -> None:
    """Only its name and its deployment matter: the check starts it, nothing runs it."""


@pytest.fixture(scope="module")
def retrain_deployment(prefect_api: None) -> str:
    from flows.serve.deployments import ensure_process_pool

    ensure_process_pool(POOL)
    stand_in_train_forecaster.to_deployment(name=POOL, work_pool_name=POOL).apply()
    return RETRAIN


@pytest.fixture(scope="module", autouse=True)
def _tracking_uri_put_back() -> Iterator[None]:
    """The checks set the process-wide MLflow tracking URI: later modules get theirs back."""
    before = mlflow.get_tracking_uri()
    yield
    mlflow.set_tracking_uri(before)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One MLflow store for the module (each check is told apart by its run id)."""
    root = tmp_path_factory.mktemp("mlflow")
    return {"mlflow_uri": f"sqlite:///{root}/mlflow.db", "mlflow_artifacts": str(root / "art")}


def write_lake(data_dir: Path, drifted: bool) -> str:
    # the generator's tide starts at its start: a whole day, of which the two peak hours
    day = generate_requests(SyntheticLogSpec(days=1, requests_per_day=15_000, bursts=0, seed=5))
    end = PEAK + pd.Timedelta(hours=2)
    records = [r for r in day if PEAK <= pd.Timestamp(r["timestamp"]) < end]
    if drifted:
        for record in records:
            if pd.Timestamp(record["timestamp"]) >= PEAK + pd.Timedelta(hours=1):
                record["prompt_tokens"] = int(record["prompt_tokens"] * 1.5)
                rank = (int(record["template_id"][1:]) + 20) % 40
                record["template_id"] = f"t{rank:03d}"
    log = data_dir / "requests.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    assert ingest_file(log, Lake(data_dir / "lake")).accepted == len(records)
    return str(data_dir)


@pytest.fixture(scope="module")
def calm_lake(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_lake(tmp_path_factory.mktemp("calm"), drifted=False)


@pytest.fixture(scope="module")
def drifted_lake(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_lake(tmp_path_factory.mktemp("drifted"), drifted=True)


def runs_of(deployment: str) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        target = client.read_deployment_by_name(deployment)
        ids = DeploymentFilter(id=DeploymentFilterId(any_=[target.id]))
        return client.read_flow_runs(deployment_filter=ids)


def test_drift_is_reported_to_mlflow_and_starts_one_retrain(
    retrain_deployment: str, drifted_lake: str, store: dict[str, str]
) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.objects import StateType

    result = check_drift_flow(data_dir=drifted_lake, retrain_deployment=retrain_deployment, **store)
    assert result["decision"] == "drift" and result["retrain"] == "triggered", result
    assert result["drifted_columns"] == ["prompt_tokens", "template"]
    no_champion = "oldest 60 min of the lake (no preheat-forecaster@champion registered)"
    assert result["reference"].startswith(no_champion)

    client = mlflow.MlflowClient(store["mlflow_uri"])
    run = client.get_run(result["mlflow_run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "preheat-drift"
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["decision"] == "drift" and tags["reason"] == result["reason"]
    assert tags["reason"].startswith("2 of 4 columns drifted (share 0.50 >= threshold 0.25): ")
    assert tags["retrain"] == "triggered" and tags["retrain_reason"] == result["reason"]
    assert tags["retrain_flow_run_id"] == result["retrain_flow_run_id"]
    assert metrics["share_drifted"] == 0.5 and metrics["drift.prompt_tokens"] >= 0.3
    assert set(metrics) >= {f"drift.{c}" for c in ("rate_rps", "output_tokens", "template")}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "drift")}
    assert artifacts == {"drift/report.html", "drift/report.json", "drift/result.json"}

    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(UUID(result["retrain_flow_run_id"]))
        deployment = prefect.read_deployment_by_name(retrain_deployment)
        notes = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))
        )
    assert flow_run.deployment_id == deployment.id and RETRAIN_TAG in flow_run.tags
    assert flow_run.state_type == StateType.SCHEDULED  # started, not waited for
    assert [n.key for n in notes] == ["drift-reason"] and result["reason"] in notes[0].data

    again = check_drift_flow(data_dir=drifted_lake, retrain_deployment=retrain_deployment, **store)
    assert again["decision"] == "drift" and again["retrain"] == "already-in-flight"
    assert again["retrain_flow_run_id"] == result["retrain_flow_run_id"]
    assert len(runs_of(retrain_deployment)) == 1


def test_no_drift_starts_nothing(
    retrain_deployment: str, calm_lake: str, store: dict[str, str]
) -> None:
    before = len(runs_of(retrain_deployment))
    result = check_drift_flow(data_dir=calm_lake, retrain_deployment=retrain_deployment, **store)
    assert result["decision"] == "no-drift" and result["retrain"] == "not-needed", result
    assert len(runs_of(retrain_deployment)) == before
    run = mlflow.MlflowClient(store["mlflow_uri"]).get_run(result["mlflow_run_id"])
    assert run.data.tags["decision"] == "no-drift" and run.data.tags["retrain"] == "not-needed"
    assert run.data.metrics["share_drifted"] == 0.0


def test_a_missing_retrain_deployment_is_recorded_not_raised(
    prefect_api: None, drifted_lake: str, store: dict[str, str]
) -> None:
    nowhere = "train-forecaster/nowhere"
    result = check_drift_flow(data_dir=drifted_lake, retrain_deployment=nowhere, **store)
    assert result["decision"] == "drift" and result["retrain"] == "deployment-not-found"
    tags = mlflow.MlflowClient(store["mlflow_uri"]).get_run(result["mlflow_run_id"]).data.tags
    assert tags["retrain"] == "deployment-not-found"
    assert tags["retrain_message"].startswith(f"no deployment {nowhere!r}")


def test_too_little_data_is_an_outcome(
    prefect_api: None, calm_lake: str, store: dict[str, str]
) -> None:
    result = check_drift_flow(data_dir=calm_lake, min_requests=5_000, **store)
    assert result["decision"] == "insufficient-data" and result["retrain"] == "not-needed"
    assert re.fullmatch(r"not enough requests in the current window: \d+ < 5000", result["reason"])
    client = mlflow.MlflowClient(store["mlflow_uri"])
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.tags["decision"] == "insufficient-data"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "drift")}
    assert artifacts == {"drift/result.json"}  # no Evidently report without a comparison


def test_the_champions_recorded_training_window_is_the_reference(
    prefect_api: None, calm_lake: str, tmp_path: Path
) -> None:
    """The forecaster's run records train_start/train_end; the check reads them back."""
    import torch

    from data_contracts.derived import read_demand
    from flows.features.flow import build_demand_task
    from models.forecast.attention import AttentionConfig
    from models.forecast.registry import CHAMPION, MODEL_NAME, train_and_register

    torch.set_num_threads(1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    build_demand_task.fn(calm_lake)
    config = AttentionConfig(epochs=1, context=8, scales=(1, 2, 4), horizon=3)
    demand = read_demand(Path(calm_lake) / "features", "3min")
    trained = train_and_register(demand, uri, tmp_path / "art", top_k=5, recent=12, config=config)
    client = mlflow.MlflowClient(uri)
    # pinned as an operator would: whether it beat the baselines is not what this test is about
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, trained["version"])
    params = client.get_run(trained["run_id"]).data.params
    assert (params["train_start"], params["train_end"]) == (
        "2024-03-04T14:00:00+00:00", "2024-03-04T15:30:00+00:00",  # 2 h, the last 25% held out
    )  # fmt: skip

    result = check_drift_flow(
        data_dir=calm_lake, mlflow_uri=uri, mlflow_artifacts=str(tmp_path / "art"), trigger=False
    )
    label = f"{MODEL_NAME} v{trained['version']} (run {trained['run_id']})"
    assert result["reference"] == (
        f"{label} training window (less than a day: all of it, not aligned to the time of day)"
    )
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.params["reference_start"] == params["train_start"]
    assert run.data.params["reference_end"] == params["train_end"]
    assert result["decision"] == "no-drift", result["reason"]

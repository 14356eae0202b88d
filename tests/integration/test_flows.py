"""The Prefect flows on a real (test-harness) Prefect API, and the demo end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from cache_runtime.request_stream import RequestLogProducer
from cache_runtime.settings import load_settings
from data_contracts.derived import read_demand
from data_contracts.lake import Lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_tasks_run_as_plain_functions(small_log: Path, tmp_path: Path) -> None:
    from flows.features.flow import build_demand_task
    from flows.ingest.flow import ingest_file_task

    report = ingest_file_task.fn(str(small_log), str(tmp_path), "auto", "default", None)
    assert report["quarantined"] == 0 and report["accepted"] == report["read"] > 500
    rows = build_demand_task.fn(str(tmp_path))
    assert rows["5s"] == len(read_demand(tmp_path / "features", "5s"))


def test_ingest_and_features_flows(prefect_api: None, small_log: Path, tmp_path: Path) -> None:
    from prefect.states import State

    from flows.features.flow import features_flow
    from flows.ingest.flow import ingest_flow

    state: State = ingest_flow(paths=[str(small_log)], data_dir=str(tmp_path), return_state=True)
    assert state.is_completed()
    summary = state.result()
    assert summary["read"] == summary["accepted"] == Lake(tmp_path / "lake").count("requests")
    rows = features_flow(data_dir=str(tmp_path))
    assert set(rows) == {"5s", "3min", "1h"} and min(rows.values()) > 0


def _train_forecaster(data_dir: Path, epochs: int) -> tuple[str, Any]:
    """The train-forecaster flow on a small panel, into an MLflow store under `data_dir`."""
    from flows.forecast.flow import train_forecaster_flow

    uri = f"sqlite:///{data_dir / 'mlflow.db'}"
    state = train_forecaster_flow(
        data_dir=str(data_dir), mlflow_uri=uri, mlflow_artifacts=str(data_dir / "artifacts"),
        top_k=10, horizon=3, epochs=epochs, return_state=True,
    )  # fmt: skip
    return uri, state


def test_train_forecaster_flow_registers_and_loads_champion(
    prefect_api: None, small_log: Path, tmp_path: Path
) -> None:
    """ingest -> features -> train-forecaster on a real Prefect API and MLflow store."""
    from flows.features.flow import features_flow
    from flows.ingest.flow import ingest_flow
    from models.forecast.registry import load_champion

    ingest_flow(paths=[str(small_log)], data_dir=str(tmp_path))
    features_flow(data_dir=str(tmp_path))
    uri, state = _train_forecaster(tmp_path, epochs=2)
    assert state.is_completed()
    result = state.result()
    assert result["version"] == "1" and result["reason"]
    if not result["promoted"]:  # gating may reject a first model that loses to a baseline
        assert "worse than the best per-key baseline" in result["reason"]
        return
    champion = load_champion(uri)
    demand = read_demand(tmp_path / "features", "3min")
    forecast = champion.predict_per_key(demand)
    assert len(forecast) == forecast[["tenant", "key"]].drop_duplicates().shape[0] * 3


def test_train_forecaster_after_a_trace_ingested_at_its_default_epoch(
    prefect_api: None, small_log: Path, mooncake_like: Path, tmp_path: Path
) -> None:
    """docs/ingest.md's Mooncake command on a lake with live traffic: the trace lands at
    2024-01-01, two months before the log; training still runs, on the latest period only."""
    import mlflow

    from flows.features.flow import features_flow
    from flows.ingest.flow import ingest_flow

    ingest_flow(paths=[str(small_log)], data_dir=str(tmp_path))
    ingest_flow(paths=[str(mooncake_like)], data_dir=str(tmp_path), format_name="mooncake")
    features_flow(data_dir=str(tmp_path))
    first = read_demand(tmp_path / "features", "3min")["bucket_start"].min()
    assert first.isoformat() == "2024-01-01T00:00:00+00:00"  # the trace, at the default epoch
    uri, state = _train_forecaster(tmp_path, epochs=1)
    assert state.is_completed()
    params = mlflow.MlflowClient(uri).get_run(state.result()["run_id"]).data.params
    assert params["train_start"].startswith("2024-03-04")  # the log's day, not the trace's


def test_train_forecaster_without_features_fails_clearly(prefect_api: None, tmp_path: Path) -> None:
    from flows.forecast.flow import train_forecaster_flow

    state = train_forecaster_flow(
        data_dir=str(tmp_path), mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}",
        mlflow_artifacts=str(tmp_path / "a"), return_state=True,
    )  # fmt: skip
    assert state.is_failed()
    with pytest.raises(LookupError, match="run `preheat ingest` and `preheat features` first"):
        state.result()


def test_ingest_flow_fails_on_unreadable_file(prefect_api: None, tmp_path: Path) -> None:
    from flows.ingest.flow import ingest_flow

    state = ingest_flow(
        paths=[str(tmp_path / "missing.jsonl")], data_dir=str(tmp_path), return_state=True
    )
    assert state.is_failed()
    with pytest.raises(Exception, match="no such file"):
        state.result()


def test_ingest_stream_flow(
    prefect_api: None, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    from flows.ingest.flow import ingest_stream_flow

    producer = RequestLogProducer(redis_client, "flow-stream")
    for i in range(120):
        producer.log_request(tenant="t", request_id=f"r{i}", prompt_tokens=3, output_tokens=1)
    producer.close()
    totals = ingest_stream_flow(redis_url=redis_url, data_dir=str(tmp_path), stream="flow-stream")
    assert (totals["written"], totals["acked"]) == (120, 120)


def test_demo_runs_the_whole_pipeline(prefect_api: None, tmp_path: Path) -> None:
    from rich.console import Console

    from flows.demo import run_demo

    settings = load_settings(
        data_dir=tmp_path / "data",
        mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        mlflow_artifacts=tmp_path / "mlruns",
    )
    summary = run_demo(settings, log=None, days=0.25, console=Console(stderr=True, quiet=True))
    assert summary["ingested"]["quarantined"] == 0
    assert summary["streamed"]["written"] > 0
    assert summary["requests"] == summary["ingested"]["accepted"] + summary["streamed"]["written"]
    assert set(summary["tenants"]) == {"acme-bank", "globex-fin", "initech"}
    assert summary["feature_rows"]["5s"] > summary["feature_rows"]["1h"] > 0
    cache = summary["cache"]
    assert cache["kv_pages_stored"] > 0 and cache["prefix_tokens_reused"] > 0
    assert cache["max_logit_difference_vs_full_prefill"] < 1e-4  # reused pages change nothing
    forecast = summary["forecast"]
    assert forecast["version"] == "1" and forecast["chosen"] and forecast["reason"]
    assert forecast["promoted"] == bool(forecast["predicted_hottest"])
    assert set(forecast["hotset_recall"]) == {"frequency", "candidate", "planner_with_candidate"}
    assert summary["llm"] == {"champion": "1"}  # the tiny GPT-2, for `make serve` after the demo
    replay = summary["replay"]
    assert replay["on"]["warmup"]["items"] > 0 and replay["off"]["warmup"]["items"] == 0
    assert Path(replay["report"]).is_file()
    written = orjson.loads((tmp_path / "data" / "reports" / "demo_summary.json").read_bytes())
    assert written["requests"] == summary["requests"]

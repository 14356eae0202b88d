"""The pure parts of `preheat serve`: peak prediction, trigger names and parameters, the specs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cache_runtime.settings import load_settings
from flows.ingest.flow import expand_paths
from flows.serve.deployments import deployment_specs
from flows.serve.peaks import hourly_totals, predict_peaks
from flows.serve.trigger import TriggerError, deployment_name, parse_params


def _daily_tide(days: int, peak_hour: int = 14) -> pd.Series:
    hours = pd.date_range("2026-11-01", periods=days * 24, freq="h", tz="UTC")
    rng = np.random.default_rng(0)
    base = 100 + rng.normal(0, 3, len(hours))
    base[hours.hour == peak_hour] += 400  # one sharp daily peak
    base[hours.hour == peak_hour - 1] += 100
    return pd.Series(base, index=hours)


def test_hourly_totals_fill_empty_hours_with_zero() -> None:
    stamps = pd.Series(pd.to_datetime(
        ["2026-11-01T00:10Z", "2026-11-01T00:50Z", "2026-11-01T03:05Z"], utc=True
    ))  # fmt: skip
    totals = hourly_totals(stamps)
    assert totals.tolist() == [2.0, 0.0, 0.0, 1.0]
    assert totals.index[0] == pd.Timestamp("2026-11-01T00:00Z")


@pytest.mark.parametrize("days", [2, 8])  # short history: seasonal naive; long: the chooser
def test_predicted_peak_is_the_daily_peak_hour(days: int) -> None:
    history = _daily_tide(days)
    result = predict_peaks(history, horizon_h=24, factor=1.5)
    assert [p.hour for p in result.peaks] == [14]
    assert result.peaks[0] > history.index[-1]
    assert len(result.forecast) == 24 and result.hours[0] == history.index[-1] + pd.Timedelta("1h")
    assert ("short history" in result.forecaster) == (days < 6)


def test_flat_demand_has_no_peaks_and_short_history_is_refused() -> None:
    flat = pd.Series(100.0, index=pd.date_range("2026-11-01", periods=72, freq="h", tz="UTC"))
    assert predict_peaks(flat).peaks == []
    with pytest.raises(ValueError, match="at least 24 hours"):
        predict_peaks(flat.iloc[:10])
    with pytest.raises(ValueError, match="factor"):
        predict_peaks(flat, factor=0)


def test_deployment_names_and_params() -> None:
    assert deployment_name("warmup", "preheat") == "warmup/preheat"
    assert deployment_name("train_forecaster", "preheat") == "train-forecaster/preheat"
    assert deployment_name("warmup/gpu-a", "preheat") == "warmup/gpu-a"
    for bad in ["", "a/b/c", "/x", "x/"]:
        with pytest.raises(TriggerError, match="expected FLOW"):
            deployment_name(bad, "preheat")
    assert parse_params(["compute_s=30", "node=gpu-a", "paths=[\"a\"]", "x=null"]) == {
        "compute_s": 30, "node": "gpu-a", "paths": ["a"], "x": None,
    }  # fmt: skip
    with pytest.raises(TriggerError, match="KEY=VALUE"):
        parse_params(["novalue"])


def test_specs_carry_settings_schedules_and_absolute_paths(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=Path("data"))
    specs = {
        s.flow_attr: s for s in deployment_specs(settings, tmp_path, "redis://x:1/0", "n1", "p")
    }
    assert specs["ingest"].interval_s == 300 and specs["features"].interval_s == 900
    assert specs["train_forecaster"].cron == "0 2 * * *"
    assert specs["tune_decay"].interval_s == 3600
    assert specs["mine_templates"].cron == "30 2 * * *"
    assert specs["warmup"].interval_s == 600 and specs["warmup"].node_local
    assert specs["plan_peak_warmups"].parameters["warmup_deployment"] == "warmup/p"
    assert specs["check_drift"].parameters["retrain_deployment"] == "train-forecaster/p"
    assert specs["check_drift"].interval_s == 3600
    assert specs["ingest_stream"].parameters["redis_url"] == "redis://x:1/0"
    assert specs["warmup"].parameters["data_dir"] == str((tmp_path / "data").resolve())
    uri = specs["train_forecaster"].parameters["mlflow_uri"]
    assert uri == f"sqlite:///{(tmp_path / 'mlruns' / 'mlflow.db').resolve()}"
    no_redis = deployment_specs(settings, tmp_path, None, "n1", "p")
    assert "ingest_stream" not in {s.flow_attr for s in no_redis}


def test_ingest_expands_directories_to_their_log_files(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in ["b.jsonl", "a.csv", "notes.txt"]:
        (inbox / name).write_text("x")
    (inbox / "sub").mkdir()
    single = tmp_path / "c.jsonl"
    assert expand_paths([str(inbox), str(single)]) == [
        str(inbox / "a.csv"), str(inbox / "b.jsonl"), str(single),
    ]  # fmt: skip


def test_the_dask_runner_setting_deploys_the_same_flow_on_dask(tmp_path: Path) -> None:
    from prefect_dask import DaskTaskRunner

    import flows.serve.entrypoints as entrypoints

    settings = load_settings(None)
    dask = settings.model_copy(
        update={"serve": settings.serve.model_copy(update={"warmup_runner": "dask"})}
    )
    specs = deployment_specs(dask, tmp_path, None, "n1", "p")
    warm = [s for s in specs if s.node_local and s.flow_attr.startswith("warmup")]
    assert [s.entrypoint for s in warm] == ["flows.serve.entrypoints.warmup_dask"]
    assert entrypoints.warmup_dask.name == entrypoints.warmup.name == "warmup"
    assert isinstance(entrypoints.warmup_dask.task_runner, DaskTaskRunner)
    assert entrypoints.warmup.retries == settings.serve.flow_retries  # the deployments' policy
    assert entrypoints.warmup.retry_delay_seconds == settings.serve.flow_retry_delay_s


def test_every_deployment_names_a_lazy_entrypoint_and_a_run_imports_only_its_flow(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    import flows.serve.entrypoints as entrypoints

    specs = deployment_specs(load_settings(None), tmp_path, None, "n1", "p")
    assert {s.flow_attr for s in specs} <= set(entrypoints.FLOWS)
    assert set(entrypoints.FLOWS) <= set(dir(entrypoints))
    _ = entrypoints.deploy_models  # loaded: now a global too, listed once
    assert len(dir(entrypoints)) == len(set(dir(entrypoints)))
    with pytest.raises(AttributeError, match="no_such_flow"):
        _ = entrypoints.no_such_flow
    # a flow run's process: the model deployment flow alone, not the warm-up or training flows
    probe = (
        "import sys, flows.serve.entrypoints as e; e.deploy_models; "
        "print(sorted(m for m in ('flows.warmup.flow', 'flows.forecast.flow', "
        "'flows.heat.flow', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"

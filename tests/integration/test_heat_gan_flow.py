"""The heat GAN end to end: the `train-heat-gan` flow on a real Prefect API and a real MLflow
store, then `preheat simulate heat` on the registered champion, as a user runs it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import mlflow
import orjson
import pytest
import torch
from helpers import invoke_cli, run_cli, write_warmable_lake

from models.heat.registry import CHAMPION, EXPERIMENT, MODEL_NAME

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_warmable_lake(tmp_path_factory.mktemp("heat"), hours=4.0)


@pytest.fixture(scope="module")
def trained(prefect_api: None, data_dir: Path) -> Iterator[tuple[dict, str, Path]]:
    from flows.heat.flow import train_heat_gan_flow

    store_dir = data_dir.parent / "mlruns"
    store = f"sqlite:///{store_dir}/mlflow.db"
    store_dir.mkdir()
    before_uri, before_threads = mlflow.get_tracking_uri(), torch.get_num_threads()
    torch.set_num_threads(1)
    result = train_heat_gan_flow(
        data_dir=str(data_dir), mlflow_uri=store, mlflow_artifacts=str(store_dir / "art"),
        top_k=20, epochs=3,
    )  # fmt: skip
    yield result, store, store_dir
    mlflow.set_tracking_uri(before_uri)
    torch.set_num_threads(before_threads)


def test_the_flow_logs_realism_registers_and_gates(trained: tuple[dict, str, Path]) -> None:
    result, store, _ = trained
    client = mlflow.MlflowClient(store)
    run = client.get_run(result["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == EXPERIMENT
    assert run.data.params["granularity"] == "3min" and run.data.params["config.history"] == "7"
    for generator in ("gan", "naive"):
        for metric in ("energy_score", "mmd", "discriminative", "autocorrelation_gap"):
            assert f"{generator}.{metric}" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert {"realism.json", "held_back_samples.png"} <= artifacts  # MLflow 3: the model is a
    # LoggedModel of its own, not a run artifact; the simulate test loads it by alias
    realism = result["realism"]["generators"]
    promoted = realism["gan"]["energy_score"] < realism["naive"]["energy_score"]
    assert result["promoted"] is promoted
    version = client.get_model_version(MODEL_NAME, result["version"])
    assert version.tags["promotion"] == ("promoted" if promoted else "rejected")
    aliases = client.get_registered_model(MODEL_NAME).aliases
    assert (str(aliases.get(CHAMPION)) == result["version"]) is promoted


def _cli(data_dir: Path, store: str, store_dir: Path, *args: str, in_process: bool = False):
    """`preheat` on the store: the installed command, or `flows.cli.main` in this process (the
    refusals, which fail before any work; a subprocess spent 13-17 s importing torch and MLflow)."""
    env = {"PREHEAT_MLFLOW_URI": store, "PREHEAT_MLFLOW_ARTIFACTS": str(store_dir / "art")}
    args = (*args, "--data-dir", str(data_dir))
    if in_process:
        return invoke_cli(*args, cwd=data_dir.parent, env=env)
    os.environ.update(env)  # run_cli inherits the environment
    try:
        return run_cli(*args, cwd=data_dir.parent)
    finally:
        for key in env:
            os.environ.pop(key, None)


def test_simulate_heat_on_the_champion(trained: tuple[dict, str, Path], data_dir: Path) -> None:
    result, store, store_dir = trained
    client = mlflow.MlflowClient(store)
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, result["version"])  # whatever won
    quiet = _cli(data_dir, store, store_dir, "simulate", "heat", "--tenant", "acme-bank", "--json")
    assert quiet.returncode == 0, quiet.stderr
    baseline = orjson.loads(quiet.stdout)
    cold = baseline["sensitivity"]["baseline_top"][-1]  # in the plan, but only just
    keys = baseline["keys"]
    assert keys > 1 and baseline["tenant"] == "acme-bank"

    plot = data_dir.parent / "sim.png"
    done = _cli(
        data_dir, store, store_dir, "simulate", "heat", "--tenant", "acme-bank",
        "--event", f"0:{cold}:3.0", "--paths", "16", "--top-k", "3", "--plot", str(plot), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    moved = out["sensitivity"]["keys"][cold]
    assert moved["expected_heat_after"] > moved["expected_heat_before"]
    assert moved["rank_after"] <= moved["rank_before"]
    assert out["events"] == [{"at": 0, "key": cold, "delta": 3.0}]
    assert plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--event", "nonsense"), "expected AT:KEY:DELTA"),
        (("--event", "0:template:nope:1"), "simulated keys"),
        (("--tenant", "nobody"), "no tenant 'nobody'"),
        ((), "several tenants"),
        (("--model", "missing.pt"), "no such file"),
    ],
)
def test_simulate_heat_bad_input_is_one_line(
    trained: tuple[dict, str, Path], data_dir: Path, args: tuple[str, ...], message: str
) -> None:
    _, store, store_dir = trained
    tenant = () if "--tenant" in args or not args else ("--tenant", "acme-bank")
    done = _cli(data_dir, store, store_dir, "simulate", "heat", *tenant, *args, in_process=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_simulate_heat_without_a_champion_says_what_to_run(data_dir: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/empty.db"
    done = _cli(
        data_dir, store, tmp_path, "simulate", "heat", "--tenant", "acme-bank", in_process=True
    )
    assert done.returncode == 2
    assert "preheat train heat-gan" in done.stderr

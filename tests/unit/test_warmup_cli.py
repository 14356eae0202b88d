"""`preheat warmup --plan-only --json` on a small ingested lake, and its one-line refusals."""

from __future__ import annotations

from pathlib import Path

import orjson
import pandas as pd
import pytest
from helpers import invoke_cli, run_cli

from data_contracts import WarmupPlan
from data_contracts.lake import Lake


@pytest.fixture(scope="module")
def lake_dir(small_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir with the small generated log ingested and its demand features built."""
    data_dir = tmp_path_factory.mktemp("warmup") / "data"
    cwd = data_dir.parent
    ingested = run_cli("ingest", str(small_log), "--data-dir", str(data_dir), cwd=cwd)
    assert ingested.returncode == 0, ingested.stderr
    built = run_cli("features", "--data-dir", str(data_dir), cwd=cwd)
    assert built.returncode == 0, built.stderr
    return data_dir


def one_line_error(done, message: str) -> None:  # type: ignore[no-untyped-def]
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preheat: error:"), done.stderr
    assert message in lines[0]


@pytest.mark.slow
def test_plan_only_json_is_a_valid_plan(lake_dir: Path) -> None:
    done = run_cli(
        "warmup", "--plan-only", "--json", "--data-dir", str(lake_dir),
        "--memory-mb", "0.5", "--ssd-mb", "1", "--compute-s", "1", "--deadline-s", "0.8",
        cwd=lake_dir.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = orjson.loads(done.stdout)
    assert set(document) == {"summary", "items", "excluded"}
    summary, items = document["summary"], document["items"]
    assert 0 < summary["planned"] == len(items) < summary["candidates"]
    plan = WarmupPlan.validate(pd.DataFrame(items), lazy=True)
    assert plan["order"].tolist() == list(range(len(plan)))
    assert summary["tiers"]["memory"]["bytes"] <= 500_000
    assert summary["tiers"]["ssd"]["bytes"] <= 1_000_000
    assert summary["tiers"]["redis"]["items"] == 0
    assert plan["finish_s"].max() <= 0.8
    # No MLflow store in this cwd: no champion, and the summary says what was used instead.
    assert summary["forecaster"] is None
    assert summary["fallback"].startswith("no MLflow store at sqlite:///mlruns/mlflow.db")
    # Which keys: the hot-set combination of the frequency experts, with no champion among them;
    # how many requests: the heat's
    assert set(summary["hot_set"]["weights"]) == {
        "last_window", "ewma_frequency", "decayed_frequency"
    }  # fmt: skip
    assert summary["hot_set"]["volume"] == "heat"
    assert set(plan["source"]) <= {"hotset", "heat"} and "hotset" in set(plan["source"])
    assert set(plan["kind"]) >= {"kv_prefix"}
    assert all(row["reason"].startswith("next best: score") for row in document["excluded"])
    assert not (lake_dir.parent / "mlruns").exists()  # planning did not create a store


@pytest.mark.slow
def test_execution_without_a_model_is_one_line(lake_dir: Path) -> None:
    done = invoke_cli("warmup", "--data-dir", str(lake_dir), cwd=lake_dir.parent)
    one_line_error(done, "no LLM to warm with: give a model path (--model-path)")
    assert not (lake_dir.parent / "mlruns").exists()  # looking for one did not create a store


def test_empty_data_dir_is_one_line(tmp_path: Path) -> None:
    done = invoke_cli("warmup", "--plan-only", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    one_line_error(done, "no lake under")


def test_empty_lake_and_bad_granularity_are_one_line(tmp_path: Path) -> None:
    Lake(tmp_path / "data" / "lake")
    done = invoke_cli("warmup", "--plan-only", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    one_line_error(done, "holds no requests: run `preheat ingest` first")
    bad = ("warmup", "--plan-only", "--granularity", "7min", "--data-dir", str(tmp_path / "data"))
    one_line_error(invoke_cli(*bad, cwd=tmp_path), "--granularity '7min': choose one of")

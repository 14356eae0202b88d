"""The CLI contract: JSON on stdout, one-line errors, exit codes 0 / 2 / 3.

The refusals run in process (`invoke_cli`: the same entry point, `flows.cli.main`); the commands
that do work, and one bad flag, run the installed `preheat` in a subprocess, as a user runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest
from helpers import invoke_cli, run_cli


@pytest.mark.slow
def test_ingest_json_summary_and_idempotence(mooncake_like: Path, tmp_path: Path) -> None:
    done = run_cli("ingest", str(mooncake_like), "--format", "mooncake", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads(done.stdout)
    assert {"files", "read", "accepted", "quarantined", "seconds"} <= summary.keys()
    assert (summary["read"], summary["accepted"], summary["quarantined"]) == (1200, 1200, 0)
    assert (tmp_path / "data" / "lake" / "requests").is_dir()  # default data dir is ./data
    again = orjson.loads(run_cli("ingest", str(mooncake_like), "--json", cwd=tmp_path).stdout)
    assert again["written"] == 0 and again["accepted"] == 1200


def test_quarantine_warns_and_strict_exits_3(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 1709510400, "prompt_tokens": -1, "output_tokens": 1}\n')
    done = invoke_cli("ingest", str(log), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 0
    assert "warning: 1 rows quarantined" in done.stderr
    strict = invoke_cli(
        "ingest", str(log), "--strict", "--data-dir", str(tmp_path / "d"), cwd=tmp_path
    )
    assert strict.returncode == 3


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preheat: error:")
    assert message in lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ingest", "missing.jsonl"), "missing.jsonl: no such file"),
        (("ingest", "--format", "xml", "x.jsonl"), "unknown --format 'xml'"),
        (("ingest", "--bogus"), "No such option: --bogus"),  # also in a subprocess, below
        (("ingest",), "Missing argument"),
        (("ingest", "x.jsonl", "--epoch", "soon"), "--epoch 'soon' is not an ISO 8601 time"),
        (("ingest", "x.jsonl", "--config", "nope.toml"), "config file not found: nope.toml"),
        (("demo", "--days", "0"), "Invalid value for '--days'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple, message: str) -> None:
    (tmp_path / "x.jsonl").write_text('{"timestamp": 1, "prompt_tokens": 1, "output_tokens": 1}\n')
    assert_one_line_exit_2(invoke_cli(*args, cwd=tmp_path), message)


def test_the_installed_command_refuses_a_bad_flag_in_one_line(tmp_path: Path) -> None:
    """The real entry point, `preheat` as installed, as a user runs it."""
    assert_one_line_exit_2(run_cli("ingest", "--bogus", cwd=tmp_path), "No such option: --bogus")


def test_bad_settings_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "preheat.toml").write_text('redis_url = "http://x"\n')
    (tmp_path / "x.jsonl").write_text("{}\n")
    done = invoke_cli("ingest", "x.jsonl", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "invalid settings" in done.stderr


def test_a_setting_in_the_environment_that_is_not_json_is_named_in_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "x.jsonl").write_text("{}\n")
    done = invoke_cli("ingest", "x.jsonl", cwd=tmp_path, env={"PREHEAT_POLICY__POOL": "lru,mq"})
    assert_one_line_exit_2(done, "PREHEAT_POLICY__POOL: lists and tables set in the environment")
    table = {"PREHEAT_SERVE": "port=1", "PREHEAT_SERVE__HOST": "127.0.0.1"}  # a string: no JSON
    done = invoke_cli("ingest", "x.jsonl", cwd=tmp_path, env=table)
    assert_one_line_exit_2(done, "(PREHEAT_SERVE: lists and tables")
    fine = invoke_cli("ingest", "x.jsonl", cwd=tmp_path, env={"PREHEAT_POLICY__POOL": '["lru"]'})
    assert "invalid settings" not in fine.stderr


@pytest.mark.slow
def test_features_command_prints_rows_per_scale(small_log: Path, tmp_path: Path) -> None:
    assert run_cli("ingest", str(small_log), cwd=tmp_path).returncode == 0
    done = run_cli("features", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = orjson.loads(done.stdout)
    assert set(rows) == {"5s", "3min", "1h"} and rows["5s"] > rows["3min"] > rows["1h"] > 0


@pytest.mark.slow
def test_register_llm_makes_the_first_version_champion_and_keeps_it(tmp_path: Path) -> None:
    import os

    from helpers import PREHEAT

    env = {**os.environ, "PREHEAT_MLFLOW_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "PREHEAT_MLFLOW_ARTIFACTS": str(tmp_path / "artifacts")}  # fmt: skip
    versions = []
    for _ in range(2):
        done = subprocess.run(
            [PREHEAT, "register", "llm", "--data-dir", str(tmp_path / "data")], cwd=tmp_path,
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        versions.append(orjson.loads(done.stdout)["version"])
    assert versions == ["1", "2"]
    from mlflow import MlflowClient

    client = MlflowClient(env["PREHEAT_MLFLOW_URI"])
    assert str(client.get_model_version_by_alias("preheat-llm", "champion").version) == "1"
    assert (tmp_path / "data" / "models" / "tiny-gpt2" / "config.json").is_file()

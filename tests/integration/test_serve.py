"""`preheat serve` as a user runs it: real Prefect server, process worker, MLflow UI and Redis.

One platform is started for the module (its start-up is the expensive part) in a temporary
project directory with a warmable lake, on free ports; the tests then look at it through the
Prefect API, trigger deployments from Python and from the CLI, and finally stop it with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from helpers import PREHEAT, run_cli, wait_until, write_warmable_lake

from cache_runtime.services import free_port
from flows.serve.run import ServeState, port_in_use, prefect_api

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BUDGETS = {"memory_mb": 0.5, "ssd_mb": 1.0, "compute_s": 1.0, "deadline_s": 1.0}


@dataclass
class Served:
    root: Path
    env: dict[str, str]
    process: subprocess.Popen[str]
    stdout: Path
    state: ServeState


def _serve_env(ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREHEAT_")}
    env.update({f"PREHEAT_SERVE__{name.upper()}": str(port) for name, port in ports.items()})
    # fail fast in tests: one retry after one second (the default is 2 retries a minute apart)
    env.update({"PREHEAT_SERVE__FLOW_RETRIES": "1", "PREHEAT_SERVE__FLOW_RETRY_DELAY_S": "1"})
    return env


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import torch

    from models.llm.registry import register_llm, save_tiny_llm

    root = tmp_path_factory.mktemp("project")
    write_warmable_lake(root)
    torch.set_num_threads(1)
    save_tiny_llm(root / "llm")
    # the registry the deployments use: the project's default store, resolved under its root
    register_llm(
        root / "llm", f"sqlite:///{root / 'mlruns' / 'mlflow.db'}", root / "mlruns" / "artifacts"
    )
    ports = {"prefect_port": free_port(), "mlflow_port": free_port(), "redis_port": free_port()}
    env = _serve_env(ports)
    stdout = root / "serve.out"
    with stdout.open("w") as out:
        process = subprocess.Popen(
            [PREHEAT, "serve"], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    state_file = root / "data" / "serve" / "preheat.json"
    try:
        wait_until(lambda: state_file.is_file() or process.poll() is not None, timeout_s=240)
        assert process.poll() is None, stdout.read_text()
        state = ServeState.load(state_file)
        assert state is not None
        yield Served(root, env, process, stdout, state)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def test_serve_prints_both_ui_addresses_and_every_service_answers(served: Served) -> None:
    import httpx

    text = served.stdout.read_text()
    assert f"Prefect UI: {served.state.prefect_ui}" in text
    assert f"MLflow UI:  {served.state.mlflow_ui}" in text
    assert httpx.get(f"{served.state.prefect_api}/health", timeout=5).json() is True
    assert httpx.get(f"{served.state.mlflow_ui}/health", timeout=5).status_code == 200
    assert served.state.redis_url and served.state.redis_url.endswith(
        f":{served.env['PREHEAT_SERVE__REDIS_PORT']}/0"
    )


def test_every_deployment_is_registered_with_its_schedule(served: Served) -> None:
    from flows.serve.deployments import describe_deployments

    with prefect_api(served.state.prefect_api):
        rows = {row["name"]: row for row in describe_deployments()}
    expected = {
        "ingest/preheat": ["every 300 s"],
        "ingest-stream/preheat": ["every 300 s"],
        "features/preheat": ["every 900 s"],
        "train-forecaster/preheat": ["cron 0 2 * * * UTC"],
        "train-heat-gan/preheat": ["cron 0 3 * * 0 UTC"],
        "tune-decay/preheat": ["every 3600 s"],
        "mine-templates/preheat": ["cron 30 2 * * * UTC"],
        "warmup/preheat": ["every 600 s"],
        "plan-peak-warmups/preheat": ["every 3600 s"],
        "deploy-models/preheat": ["every 900 s"],
        "check-drift/preheat": ["every 3600 s"],
    }
    assert {name: row["schedules"] for name, row in rows.items()} == expected
    assert all(row["work_pool"] == "preheat" and row["active"] for row in rows.values())
    assert rows["warmup/preheat"]["entrypoint"] == "flows.serve.entrypoints.warmup"


def test_a_second_serve_reports_the_running_instance(served: Served) -> None:
    second = subprocess.run(
        [PREHEAT, "serve"], cwd=served.root, env=served.env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stderr and str(served.process.pid) in second.stderr
    assert f"Prefect UI: {served.state.prefect_ui}" in second.stdout


def test_triggered_warmup_completes_and_the_cache_holds_the_planned_items(served: Served) -> None:
    from prefect.deployments import run_deployment

    from cache_runtime.kv_pages import page_keys
    from cache_runtime.node_cache import node_cache
    from cache_runtime.settings import Settings
    from models.llm.backends import HFBackend

    parameters = {"model_path": str(served.root / "llm"), "batch_size": 8, **BUDGETS}
    with prefect_api(served.state.prefect_api):
        run = run_deployment("warmup/preheat", parameters=parameters, timeout=300)
    assert run.state is not None and run.state.is_completed(), run.state
    data_dir = served.root / "data"
    ledgers = sorted((data_dir / "warmup").glob("*.sqlite"))
    assert len(ledgers) == 1
    with sqlite3.connect(ledgers[0]) as db:
        # the ledger's own table (models.warmup.execute), read here as the UI of a user would not
        rows = db.execute("SELECT kind, item, tenant, text, state FROM items").fetchall()
    assert len(rows) > 20 and {r[4] for r in rows} == {"done"}
    cache = node_cache(Settings(data_dir=data_dir), 1 << 20, 2 << 20)
    try:
        backend = HFBackend.from_path(served.root / "llm")
        kv = [r for r in rows if r[0] == "kv_prefix"]
        assert kv
        for _, item, tenant, text, _ in kv:
            keys = page_keys(tenant, backend.model_id, backend.encode(text))
            assert keys and cache.longest_prefix(keys) == len(keys), item
        backend.close()
    finally:
        cache.close()


def test_trigger_wait_reports_a_failed_run_after_its_retries(served: Served) -> None:
    from prefect import get_client

    missing = served.root / "no-such-log.jsonl"
    result = run_cli(
        "trigger", "ingest", "--param", f'paths=["{missing}"]', "--wait", "--timeout", "240",
        "--json", cwd=served.root,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    out = orjson.loads(result.stdout)
    assert out["state"] == "FAILED" and out["failed"] is True
    with prefect_api(served.state.prefect_api), get_client(sync_client=True) as client:
        run = client.read_flow_run(out["flow_run_id"])
    assert run.run_count == 2  # the first attempt and the deployments' one retry


def test_trigger_rejects_unknown_deployments_and_parameters(served: Served) -> None:
    unknown = run_cli("trigger", "no-such-flow", cwd=served.root)
    assert unknown.returncode == 2
    assert "no deployment 'no-such-flow/preheat'" in unknown.stderr
    assert "warmup/preheat" in unknown.stderr  # the known ones are listed
    bad = run_cli("trigger", "warmup", "--param", "bogus=1", cwd=served.root)
    assert bad.returncode == 2 and "unknown parameter(s) bogus" in bad.stderr


def test_deploy_models_puts_the_champion_on_the_node_and_records_it(served: Served) -> None:
    import socket

    from mlflow import MlflowClient
    from prefect.deployments import run_deployment

    from models.node_manifest import deployed_tag, read_manifest

    with prefect_api(served.state.prefect_api):
        run = run_deployment(
            "deploy-models/preheat", parameters={"models": ["preheat-llm"]}, timeout=300
        )
    assert run.state is not None and run.state.is_completed(), run.state
    node = socket.gethostname()
    manifest = read_manifest(served.root / "data", node)
    assert manifest["preheat-llm"].version == "1"
    client = MlflowClient(f"sqlite:///{served.root / 'mlruns' / 'mlflow.db'}")
    version = client.get_model_version("preheat-llm", "1")
    assert deployed_tag(node) in version.tags


def test_a_serving_node_runs_its_own_deployments_on_its_own_pool(
    served: Served, tmp_path: Path
) -> None:
    """`preheat serve --pool node-a --worker-only`: the node registers its node-local
    deployments on its pool, and only its worker can run them (no other worker polls node-a)."""
    from prefect.deployments import run_deployment

    from models.node_manifest import read_manifest

    env = {**served.env, "PREHEAT_MLFLOW_URI": served.state.mlflow_ui or ""}
    node = subprocess.Popen(
        [PREHEAT, "serve", "--pool", "node-a", "--worker-only", "--node", "node-a",
         "--api-url", served.state.prefect_api],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    state_file = tmp_path / "data" / "serve" / "node-a.json"
    try:
        wait_until(lambda: state_file.is_file() or node.poll() is not None, timeout_s=120)
        assert node.poll() is None, node.stdout.read() if node.stdout else ""
        state = ServeState.load(state_file)
        assert state is not None
        assert state.deployments == ["deploy-models/node-a", "warmup/node-a"]
        with prefect_api(served.state.prefect_api):
            run = run_deployment(
                "deploy-models/node-a", parameters={"models": ["preheat-llm"]}, timeout=300
            )
        assert run.state is not None and run.state.is_completed(), run.state
        assert run.work_pool_name == "node-a"
        # the node's copy, fetched through the coordinator's MLflow server
        assert read_manifest(tmp_path / "data", "node-a")["preheat-llm"].version == "1"
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0
    assert not state_file.exists()


def test_sigterm_stops_every_service_and_removes_the_state(served: Served) -> None:
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=90) == 0
    for name in ("PREFECT_PORT", "MLFLOW_PORT", "REDIS_PORT"):
        port = int(served.env[f"PREHEAT_SERVE__{name}"])
        assert not port_in_use("127.0.0.1", port), name
    assert not (served.root / "data" / "serve" / "preheat.json").exists()

"""The gateway started as the README starts it: `preheat gateway --keys keys.json`, in a fresh
process with no MLflow state, from a directory holding only the keys file and the MLflow store
(as the repository root holds after `make demo`), then used with the `openai` client.

It serves the registry's champion (no `--model-path`), writes nothing outside `data/` and
`mlruns/`, and supervises the `redis-server` it started: killed by PID, it is reaped and started
again on the same port while the gateway keeps answering.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from cache_runtime.services import free_port

pytestmark = pytest.mark.integration


def _redis_children(pid: int) -> list[int]:
    """The `redis-server` processes whose parent is `pid` (from /proc: no psutil needed)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"redis-server" in command and " Z " not in stat:
            found.append(int(entry.name))
    return found


def _wait(predicate: object, timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.1)  # polling the process's state, not a blind wait
    raise AssertionError(f"{what}: not within {timeout_s:g}s")


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    import torch

    from models.llm.registry import register_llm, save_tiny_llm

    torch.set_num_threads(1)
    root = tmp_path / "checkout"
    root.mkdir()
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    (root / "mlruns").mkdir()
    register_llm(save_tiny_llm(tmp_path / "tiny-gpt2"), uri, root / "mlruns")
    (root / "keys.json").write_text(json.dumps({"keys": {"sk-acme-1": "acme"}}))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREHEAT_"))} | {
        "PREHEAT_MLFLOW_URI": uri,
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    preheat = Path(sys.executable).with_name("preheat")
    log = (tmp_path / "gateway.log").open("wb")
    process = subprocess.Popen(
        [str(preheat), "gateway", "--keys", "keys.json", "--port", str(port)],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / "gateway.log").read_text()[-2000:]
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait(ready, 240, "the gateway answering /healthz")
        yield url, process, root
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


def test_the_readme_command_serves_the_champion_and_supervises_its_redis(
    started: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, process, root = started
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-acme-1", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "What are the wire transfer fees?"}]
    first = client.chat.completions.with_raw_response.create(
        model=model, messages=question, temperature=0
    )
    again = client.chat.completions.with_raw_response.create(
        model=model, messages=question, temperature=0
    )
    assert first.headers["x-preheat-cache"] == "miss"
    assert again.headers["x-preheat-cache"] == "exact-memory"
    assert sorted(p.name for p in root.iterdir()) == ["data", "keys.json", "mlruns"]

    (redis_pid,) = _redis_children(process.pid)
    os.kill(redis_pid, signal.SIGKILL)
    restarted = _wait(
        lambda: [p for p in _redis_children(process.pid) if p != redis_pid],
        30, "the embedded redis-server started again",
    )  # fmt: skip
    assert not Path(f"/proc/{redis_pid}").exists()  # reaped, not left <defunct>
    assert len(restarted) == 1  # type: ignore[arg-type]
    _wait(lambda: httpx.get(f"{url}/healthz").json()["status"] == "ok", 30, "healthz ok again")
    after = client.chat.completions.with_raw_response.create(
        model=model, messages=question, temperature=0
    )
    # a new, empty Redis: the answer from before it is not trusted, the model answers again
    assert after.headers["x-preheat-cache"] in ("miss", "prefix")

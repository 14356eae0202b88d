"""The coordinator's long-running processes: Prefect server, process worker, MLflow UI.

Each runs as a child process with its output in a log file (a pipe nobody reads would block the
child once full), is ready when its health endpoint answers (polled, never a blind sleep), and is
stopped with SIGTERM, then SIGKILL after a grace period. Children start in their own session so a
Ctrl-C in the terminal reaches only `preheat serve`, which then stops them in order; a child that
dies on its own is noticed by `ManagedProcess.exited`.

Wiring without a Prefect import of its own: `preheat serve` runs Prefect's server and worker and
MLflow's server as their own programs (`prefect server start`, `prefect worker start`, `mlflow
server`), so this module builds their command lines and environments and supervises the
children. It is orchestration, not a library: nothing but `preheat serve` (and the tests of its
Prefect set-up) starts these processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent  # the venv's bin: `prefect` and `mlflow` live beside python
TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


class ServiceStartError(RuntimeError):
    """A service exited or did not become ready in time; the message carries its log's tail."""


@dataclass
class ManagedProcess:
    """One child process with a log file, a readiness check and an orderly stop."""

    name: str
    args: Sequence[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                list(self.args),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **TELEMETRY_OFF, **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.process.pid

    def exited(self) -> int | None:
        """The exit code if the process has ended, else None."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 5) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return " | ".join(line.strip() for line in text[-lines:] if line.strip())[-600:]

    def wait_ready(self, is_ready: Callable[[], bool], timeout_s: float) -> float:
        """Poll `is_ready` until it is true; returns the seconds it took.

        Raises:
            ServiceStartError: the process exited, or the deadline passed.
        """
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            code = self.exited()
            if code is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {code}: {self.log_tail()} (log: {self.log_path})"
                )
            if is_ready():
                return time.monotonic() - started
            time.sleep(0.25)  # polling interval between readiness checks
        raise ServiceStartError(
            f"{self.name} was not ready within {timeout_s:.0f} s: {self.log_tail()} "
            f"(log: {self.log_path})"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`; safe to call twice."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(timeout=10)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The child leads its own session: the group holds what it spawned (uvicorn workers, flow
    # runs started by the worker), and all of it must stop with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def http_ok(url: str, expect: Callable[[httpx.Response], bool] | None = None) -> Callable[[], bool]:
    """A readiness check: GET `url` answers 200 (and `expect` holds, when given)."""

    def check() -> bool:
        try:
            response = httpx.get(url, timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and (expect is None or expect(response))

    return check


def redis_messaging_env(redis_url: str) -> dict[str, str]:
    """Prefect's event bus and message cache on Redis (prefect-redis) instead of in memory.

    With it, several API servers (`services=False` replicas behind a load balancer) share one
    event stream: an event any of them receives reaches the one running the services (the
    event persister, triggers, automations). Without it each server's events stay in its own
    memory. The database must be shared too (PostgreSQL in production, see README).
    """
    return {
        "PREFECT_MESSAGING_BROKER": "prefect_redis.messaging",
        "PREFECT_MESSAGING_CACHE": "prefect_redis.messaging",
        "PREFECT_REDIS_MESSAGING_URL": redis_url,
    }


def prefect_server(
    host: str, port: int, home: Path, log_dir: Path, *,
    database_url: str | None = None, messaging_redis: str | None = None, services: bool = True,
) -> ManagedProcess:  # fmt: skip
    """`prefect server start`; its database under `home` (the project's, not ~/.prefect) unless
    `database_url` names one (PostgreSQL: `postgresql+asyncpg://...`)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url
        or f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_UI_API_URL": f"http://{host}:{port}/api",
        **(redis_messaging_env(messaging_redis) if messaging_redis else {}),
    }
    args = [str(BIN / "prefect"), "server", "start", "--host", host, "--port", str(port)]
    if not services:
        args.append("--no-services")
    name = "prefect server" if services else f"prefect api replica :{port}"
    return ManagedProcess(name, args, log_dir / f"prefect-server-{port}.log", env)


def prefect_worker(
    api_url: str, pool: str, worker_name: str, home: Path, log_dir: Path, cwd: Path
) -> ManagedProcess:
    """A process worker on `pool`: it runs each flow run of the pool in a child process."""
    env = {"PREFECT_API_URL": api_url, "PREFECT_HOME": str(home)}
    args = [
        str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process",
        "--name", worker_name,
    ]  # fmt: skip
    return ManagedProcess(f"worker {worker_name}", args, log_dir / f"worker-{pool}.log", env, cwd)


def mlflow_ui(
    host: str, port: int, backend_uri: str, artifacts: Path, log_dir: Path, cwd: Path
) -> ManagedProcess:
    """`mlflow server` on the project's sqlite store: the UI for runs and registered models."""
    args = [
        str(BIN / "mlflow"), "server", "--backend-store-uri", backend_uri,
        "--default-artifact-root", str(artifacts), "--host", host, "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    return ManagedProcess("mlflow ui", args, log_dir / "mlflow.log", {}, cwd)

"""The coordinator's long-running processes: Prefect server, process worker, MLflow UI.

Each is a `cache_runtime.child_process.ManagedProcess`: a child process with its output in a log
file, ready when its health endpoint answers, stopped in order by `preheat serve`. Telemetry is
off in all of them (`TELEMETRY_OFF`, under each one's own environment).

Wiring without a Prefect import of its own: `preheat serve` runs Prefect's server and worker and
MLflow's server as their own programs (`prefect server start`, `prefect worker start`, `mlflow
server`), so this module builds their command lines and environments; the supervision is
`cache_runtime.child_process`'s. It is orchestration, not a library: nothing but `preheat serve`
(and the tests of its Prefect set-up) starts these processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cache_runtime.child_process import ManagedProcess

BIN = Path(sys.executable).parent  # the venv's bin: `prefect` and `mlflow` live beside python
TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


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
        **TELEMETRY_OFF,
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
    env = {**TELEMETRY_OFF, "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home)}
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
    return ManagedProcess("mlflow ui", args, log_dir / "mlflow.log", TELEMETRY_OFF, cwd)

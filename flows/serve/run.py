"""`preheat serve`: bring the coordinator (or one serving node's worker) up, keep it up, stop it.

Coordinator: the project's Redis, the Prefect server and the MLflow UI start together (their
start-up overlaps; each is polled until healthy), the deployments are registered with their
schedules, and a process worker on the coordinator's pool runs them. Serving node
(`--worker-only --pool NAME`): a worker on the node's own pool against the coordinator's API,
with the node-local deployments (warm-up, deploy-models) registered for that pool.

One instance per data directory and pool: an exclusive lock (released by the OS when the process
dies, so a crash never leaves a stale lock) guards start-up, and a second `preheat serve` reports
the running one from its state file instead of failing on a busy port.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cache_runtime.child_process import (
    ManagedProcess,
    ServiceStartError,
    http_ok,
    instance_lock,
    restore_signals,
    stop_on_signals,
)
from cache_runtime.settings import Settings
from flows.serve.deployments import (
    absolute_sqlite,
    deployment_specs,
    describe_deployments,
    register,
)
from flows.serve.processes import mlflow_ui, prefect_server, prefect_worker


class ServeError(RuntimeError):
    """Serve cannot start (a port taken by another program, a service that failed)."""


@dataclass(frozen=True)
class ServeState:
    """What a running `preheat serve` publishes in `<data_dir>/serve/<pool>.json`."""

    pid: int
    pool: str
    node: str
    prefect_api: str
    prefect_ui: str | None
    mlflow_ui: str | None
    redis_url: str | None
    deployments: list[str]
    started_at: float
    ready_s: float

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @staticmethod
    def load(path: Path) -> ServeState | None:
        try:
            return ServeState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


@dataclass(frozen=True)
class ServeOptions:
    root: Path  # the project directory: flow runs start here, relative settings resolve here
    pool: str
    node: str
    worker_only: bool = False
    api_url: str | None = None  # the coordinator's Prefect API (worker-only nodes)


def serve_dir(settings: Settings, root: Path) -> Path:
    return (root / settings.data_dir / "serve").resolve()


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _check_ports(settings: Settings) -> None:
    serve = settings.serve
    ports = [("prefect_port", serve.prefect_port), ("mlflow_port", serve.mlflow_port)]
    if settings.redis_url is None:  # the project's own Redis is started only without one
        ports.append(("redis_port", serve.redis_port))
    for what, port in ports:
        if port_in_use(serve.host, port):
            env = f"PREHEAT_SERVE__{what.upper()}"
            raise ServeError(
                f"port {port} on {serve.host} is used by another program; choose another with "
                f"{env} or [serve] {what} in preheat.toml"
            )


def _worker_online(api_url: str, pool: str, name: str) -> Callable[[], bool]:
    def check() -> bool:
        from prefect import get_client

        with prefect_api(api_url), get_client(sync_client=True) as client:
            try:
                workers = client.read_workers_for_work_pool(pool)
            except Exception:  # the pool is created by registration; the API may be busy
                return False
        return any(w.name == name and str(w.status).upper().endswith("ONLINE") for w in workers)

    return check


@contextmanager
def prefect_api(api_url: str) -> Iterator[None]:
    """Talk to the Prefect API at `api_url` inside the block (whatever the profile says)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        yield


class Platform:
    """The processes of one `preheat serve`, started in order and stopped in reverse."""

    def __init__(
        self, settings: Settings, options: ServeOptions, log: Callable[[str], None]
    ) -> None:
        self.settings, self.options, self.log = settings, options, log
        self.dir = serve_dir(settings, options.root)
        self.processes: list[ManagedProcess] = []
        self.redis: Any = None

    def start(self) -> ServeState:
        started = time.monotonic()
        serve, opts = self.settings.serve, self.options
        prefect_home = self.dir / "prefect"
        redis_url = self.settings.redis_url
        ui = mlflow = None
        if opts.worker_only:
            api_url = opts.api_url or f"http://{serve.host}:{serve.prefect_port}/api"
        else:
            _check_ports(self.settings)
            from cache_runtime.services import RedisServer

            if redis_url is None:
                self.redis = RedisServer(port=serve.redis_port).start()
                redis_url = self.redis.url
            server = prefect_server(
                serve.host, serve.prefect_port, prefect_home, self.dir,
                database_url=serve.prefect_database_url,
                messaging_redis=redis_url if serve.prefect_messaging == "redis" else None,
            )  # fmt: skip
            api_url = f"http://{serve.host}:{serve.prefect_port}/api"
            mlflow_proc = mlflow_ui(
                serve.host, serve.mlflow_port, self._mlflow_uri(), self._artifacts(), self.dir,
                opts.root,
            )  # fmt: skip
            self.processes += [server.start(), mlflow_proc.start()]
            server.wait_ready(http_ok(f"{api_url}/health"), serve.startup_timeout_s)
            mlflow_proc.wait_ready(
                http_ok(f"http://{serve.host}:{serve.mlflow_port}/health"),
                serve.startup_timeout_s,
            )  # fmt: skip
            ui = f"http://{serve.host}:{serve.prefect_port}"
            mlflow = f"http://{serve.host}:{serve.mlflow_port}"
            self.log(f"Prefect API and MLflow UI ready in {time.monotonic() - started:.1f} s")
        specs = deployment_specs(self.settings, opts.root, redis_url, opts.node, opts.pool)
        if opts.worker_only:
            specs = [s for s in specs if s.node_local]
        with prefect_api(api_url):
            names = sorted(register(specs, opts.pool, opts.root, serve.timezone))
        self.log(f"registered {len(names)} deployments on work pool {opts.pool!r}")
        worker = prefect_worker(
            api_url, opts.pool, opts.node, prefect_home, self.dir, opts.root
        ).start()
        self.processes.append(worker)
        worker.wait_ready(_worker_online(api_url, opts.pool, opts.node), serve.startup_timeout_s)
        return ServeState(
            pid=os.getpid(), pool=opts.pool, node=opts.node, prefect_api=api_url, prefect_ui=ui,
            mlflow_ui=mlflow, redis_url=redis_url, deployments=names, started_at=time.time(),
            ready_s=round(time.monotonic() - started, 2),
        )  # fmt: skip

    def _mlflow_uri(self) -> str:
        return absolute_sqlite(self.settings.mlflow_uri, self.options.root)

    def _artifacts(self) -> Path:
        path = (self.options.root / self.settings.mlflow_artifacts).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def exited(self) -> ManagedProcess | None:
        """The first process that ended on its own, if any."""
        return next((p for p in self.processes if p.exited() is not None), None)

    def stop(self) -> None:
        for process in reversed(self.processes):  # the worker first: no new flow runs start
            process.stop()
        self.processes.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


def serve(
    settings: Settings, options: ServeOptions, log: Callable[[str], None],
    on_ready: Callable[[ServeState], None], stop: threading.Event | None = None,
) -> int:  # fmt: skip
    """Run until SIGINT/SIGTERM (or `stop`); returns the exit code.

    Exit 0 after a clean stop or when another instance already serves this data directory and
    pool (reported through `on_ready` with its state); 1 when a service died while serving.
    """
    directory = serve_dir(settings, options.root)
    state_path = directory / f"{options.pool}.json"
    with instance_lock(directory / f"{options.pool}.lock") as held:
        if held is None:
            running = ServeState.load(state_path)
            if running is None:
                raise ServeError(f"another preheat serve for pool {options.pool!r} is starting "
                                 f"(lock {directory / (options.pool + '.lock')})")  # fmt: skip
            log(f"preheat serve is already running (pid {running.pid}); not starting another")
            on_ready(running)
            return 0
        stop = stop or threading.Event()
        previous = stop_on_signals(stop)
        platform = Platform(settings, options, log)
        try:
            try:
                state = platform.start()
            except ServiceStartError as err:
                raise ServeError(str(err)) from None
            state.save(state_path)
            on_ready(state)
            while not stop.wait(1.0):
                dead = platform.exited()
                if dead is not None:
                    log(f"{dead.name} exited (code {dead.exited()}): {dead.log_tail()}; stopping")
                    return 1
            log("stopping: worker, MLflow UI, Prefect server, Redis")
            return 0
        finally:
            platform.stop()
            with suppress(FileNotFoundError):
                state_path.unlink()
            restore_signals(previous)


def deployments_report(api_url: str) -> list[dict[str, Any]]:
    with prefect_api(api_url):
        return describe_deployments()

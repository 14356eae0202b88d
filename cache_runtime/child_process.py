"""A child process with its output in a log file, a readiness check and an orderly stop.

Its output goes to a log file (a pipe nobody reads would block the child once full); it is ready
when a check passes (polled, never a blind sleep: `http_ok` for a health endpoint), and is stopped
with SIGTERM, then SIGKILL after a grace period. Children start in their own session, so a Ctrl-C
in the terminal reaches only the parent, which then stops them in order; a child that dies on its
own is noticed by `ManagedProcess.exited`.

The supervising process's own side: `instance_lock` keeps it to one instance per lock file (the
OS releases the lock when the process dies, so a crash never leaves a stale one), and
`stop_on_signals` turns SIGINT and SIGTERM into a stop event it waits on.

`preheat serve` runs the Prefect server and worker and the MLflow UI this way
(`flows.serve.processes` builds their command lines); the embedded redis-server has its own
supervisor (`cache_runtime.services`), which restarts it and proves by its pid that the server
answering is the one it started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx


class ServiceStartError(RuntimeError):
    """A service exited or did not become ready in time; the message carries its log's tail."""


@dataclass
class ManagedProcess:
    """One child process with a log file, a readiness check and an orderly stop.

    `env` is laid over the parent's environment.
    """

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
                env={**os.environ, **self.env},
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


@contextlib.contextmanager
def instance_lock(path: Path) -> Iterator[IO[str] | None]:
    """Yield the open lock file when this process holds the lock, else None (another holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield handle
    finally:
        handle.close()


def stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGINT and SIGTERM set `stop` from now on; returns the handlers they replaced, for
    `restore_signals`. Off the main thread it does nothing (only the main thread can handle
    signals; tests run a supervisor in a thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    """Put back the handlers `stop_on_signals` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)

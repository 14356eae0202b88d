"""`cache_runtime.child_process`: readiness polled, a dead child reported with its log, the group
stopped; the supervisor's instance lock and stop signals."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from cache_runtime.child_process import (
    ManagedProcess,
    ServiceStartError,
    instance_lock,
    restore_signals,
    stop_on_signals,
)


def _python(code: str, log: Path, **env: str) -> ManagedProcess:
    return ManagedProcess("child", [sys.executable, "-c", code], log, env)


def test_ready_when_the_check_passes_and_stopped_on_request(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = _python(
        "import os, pathlib, time; pathlib.Path(os.environ['READY']).touch(); time.sleep(60)",
        tmp_path / "child.log", READY=str(ready),
    ).start()  # fmt: skip
    try:
        child.wait_ready(ready.exists, timeout_s=30)
        assert child.exited() is None
    finally:
        child.stop(grace_s=5)
    assert child.process is None
    child.stop()  # a second stop is a no-op


def test_a_child_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    child = _python("print('no config here'); raise SystemExit(3)", tmp_path / "child.log")
    with pytest.raises(ServiceStartError, match=r"child exited with code 3: no config here"):
        child.start().wait_ready(lambda: False, timeout_s=30)


def test_a_child_not_ready_in_time_is_reported(tmp_path: Path) -> None:
    child = _python("import time; time.sleep(60)", tmp_path / "child.log").start()
    try:
        with pytest.raises(ServiceStartError, match="child was not ready within 0 s"):
            child.wait_ready(lambda: False, timeout_s=0.3)
    finally:
        child.stop(grace_s=5)


def test_a_second_holder_of_the_instance_lock_is_told_no(tmp_path: Path) -> None:
    lock = tmp_path / "serve" / "pool.lock"
    with instance_lock(lock) as first:
        assert first is not None
        with instance_lock(lock) as second:
            assert second is None
    with instance_lock(lock) as again:  # released with the first holder
        assert again is not None


def test_sigterm_sets_the_stop_event_until_the_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
    finally:
        restore_signals(previous)
    assert signal.getsignal(signal.SIGTERM) is before

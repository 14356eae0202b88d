"""`cache_runtime.child_process`: readiness polled, a dead child reported with its log, the group
stopped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cache_runtime.child_process import ManagedProcess, ServiceStartError


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

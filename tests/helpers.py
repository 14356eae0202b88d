"""Small test helpers shared by unit and integration tests (importable: tests/ is on sys.path
through its conftest)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


class FakeClock:
    """An injectable clock: tests move time by assigning `now`, never by sleeping."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll `predicate` until true (for real servers and threads); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached in time")
        time.sleep(0.01)


PREHEAT = str(Path(sys.executable).parent / "preheat")


def run_cli(*args: str, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the installed `preheat` command as a user would, capturing stdout and stderr."""
    return subprocess.run(
        [PREHEAT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
    )

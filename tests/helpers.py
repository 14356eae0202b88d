"""Small test helpers shared by unit and integration tests (importable: tests/ is on sys.path
through its conftest)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def invoke_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `preheat` in this process, as `run_cli` does in a subprocess: the same entry point
    (`flows.cli.main`, which turns every error into one line and an exit code), with stdout and
    stderr captured by Typer's `CliRunner` and `env` set for the call only.

    For the refusals, which fail before any work: a subprocess costs them an interpreter start
    and the CLI's imports, seconds each on the 2-core CI machine. The commands set Prefect and
    MLflow defaults in `os.environ` (`configure_runtime_env`): the environment is put back. Other
    process-wide state a command sets stays (MLflow's tracking URI, once a store is opened), as it
    does after any test that opens one: tests name their store.
    """
    from typer.testing import CliRunner

    from flows.cli import main

    saved_env, saved_argv = dict(os.environ), sys.argv
    try:
        with contextlib.chdir(cwd), CliRunner().isolation(env=env) as (out, err, _):
            sys.argv = ["preheat", *args]
            try:
                main()
            except SystemExit as done:
                code = done.code
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess([PREHEAT, *args], int(code or 0), stdout, stderr)


def write_warmable_lake(root: Path, hours: float = 2.0) -> Path:
    """`root/data`: generated requests (each prompt carrying its tenant's system prompt, as real
    prompt logs do) ingested with features: a lake that warm-up can plan and warm from.

    The generator's prompt texts stand for their prefix hashes without that shared head, so
    without it a KV item's text would be shorter than one 16-token page.
    """
    import orjson

    from flows.features.flow import build_demand_task
    from flows.ingest.flow import ingest_file_task
    from models.ingest.synthetic import SyntheticLogSpec, write_synthetic_log

    log = root / "requests.jsonl"
    spec = SyntheticLogSpec(days=hours / 24, requests_per_day=18_000, bursts=1)
    write_synthetic_log(log, spec)
    records = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    for record in records:
        system = f"You are the {record['tenant']} assistant. Follow the compliance policy. " * 4
        record["prompt"] = system + record["prompt"]
    log.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    data_dir = root / "data"
    report = ingest_file_task.fn(str(log), str(data_dir), "auto", "default", None)
    assert report["accepted"] == len(records)
    build_demand_task.fn(str(data_dir))
    return data_dir


def write_page_lake(
    data_dir: Path, pages: list[list[int]], tokens: Any = 64, priority: Any = None
) -> None:
    """`data_dir/lake`'s request log: one request a second, each the KV pages (prefix hashes) of
    its prompt, as the scheduled tuning and `benchmarks/tier_policy.py --lake` read them."""
    import pandas as pd

    from data_contracts import RequestLog
    from data_contracts.lake import Lake

    requests = pd.DataFrame(
        {
            "timestamp": pd.date_range("2024-03-04", periods=len(pages), freq="s", tz="UTC"),
            "tenant": "acme",
            "request_id": [f"r{i}" for i in range(len(pages))],
            "session_id": "s1",
            "prompt": None,
            "prompt_tokens": tokens,
            "output_tokens": 5,
            "prefix_hashes": pages,
            "template_id": None,
            "route": None,
            "latency_ms": None,
            "priority": priority,
        }
    )
    Lake(data_dir / "lake").append("requests", RequestLog.validate(requests))


def templated_prompts(requests: int = 3000, seed: int = 0) -> Any:
    """An `AccessTrace` of prompts as a templated application sends them: one of 30 templates
    (3 shared pages, Zipf-popular) and a fresh tail of 4-8 pages never asked for again."""
    import numpy as np

    from cache_runtime.traces import AccessTrace

    rng = np.random.default_rng(seed)
    pages: list[int] = []
    starts: list[int] = []
    fresh = 10**6
    for _ in range(requests):
        template = int(rng.zipf(1.5)) % 30
        tail = int(rng.integers(4, 9))
        starts.append(len(pages))
        pages += [template * 10 + j for j in range(3)] + list(range(fresh, fresh + tail))
        fresh += tail
    return AccessTrace("templated", np.array(pages), np.array(starts))


def multi_turn_chats(requests: int = 4000, seed: int = 0) -> Any:
    """An `AccessTrace` of about 40 live conversations: each turn's prompt is the conversation
    so far (its previous turn's pages) and 1-4 new pages; a chat ends after 40 pages or at
    random."""
    import numpy as np

    from cache_runtime.traces import AccessTrace

    rng = np.random.default_rng(seed)
    chats: list[list[int]] = []
    pages: list[int] = []
    starts: list[int] = []
    fresh = 0
    for _ in range(requests):
        if len(chats) < 40 or rng.random() < 0.1:
            chats.append([])
        i = int(rng.integers(len(chats)))
        new = int(rng.integers(1, 5))
        chats[i] += range(fresh, fresh + new)
        fresh += new
        starts.append(len(pages))
        pages += chats[i]
        if len(chats[i]) > 40 or rng.random() < 0.15:
            chats.pop(i)
    return AccessTrace("chats", np.array(pages), np.array(starts))


def ledger_frame(data_dir: Path, plan: str, target: str) -> Any:
    """A warm-up ledger's rows (one per item) as a DataFrame."""
    from models.warmup.execute import WarmLedger

    ledger = WarmLedger(WarmLedger.path_for(data_dir, plan), target)
    try:
        return ledger.frame()
    finally:
        ledger.close()


DEMAND_START = "2024-03-04T00:00:00Z"
DEMAND_BUCKET = "3min"  # `demand_from_rows`' granularity, and its buckets' width


def demand_from_rows(rows: list[tuple[str, str, int, float]]) -> Any:
    """`DemandSeries` from (tenant, key, bucket index, count) tuples: `DEMAND_BUCKET` buckets
    from `DEMAND_START`."""
    import pandas as pd

    from data_contracts import DemandSeries

    frame = pd.DataFrame(rows, columns=["tenant", "key", "bucket", "count"])
    frame.insert(2, "granularity", DEMAND_BUCKET)
    start, width = pd.Timestamp(DEMAND_START), pd.Timedelta(DEMAND_BUCKET)
    frame.insert(3, "bucket_start", start + frame.pop("bucket") * width)
    return DemandSeries.validate(frame.astype({"count": "float64"}), lazy=True)

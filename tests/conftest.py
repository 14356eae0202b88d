"""Shared fixtures: a real redis-server and a real Prefect API per session, temp lakes, small
generated data.

Prefect and MLflow read their settings at import: the environment is fixed here, before any test
module imports them, so tests never touch the user's ~/.prefect or send telemetry.

Prefect's ephemeral mode is switched off: a test that runs a flow or task without the `prefect_api`
fixture fails at once ("No Prefect API URL provided") instead of starting a server of its own, one
per test process, under Prefect's default startup timeout, which a loaded 2-core CI machine
outlasts. A subprocess inherits the setting, so a CLI test that would run a flow fails the same way.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_STATE = tempfile.mkdtemp(prefix="preheat-tests-")
os.environ["PREFECT_HOME"] = os.path.join(_STATE, "prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"
os.environ.pop("PREHEAT_REDIS_URL", None)
os.environ.pop("PREHEAT_CONFIG", None)

from cache_runtime.services import RedisServer  # noqa: E402
from data_contracts.lake import Lake  # noqa: E402


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server on a free loopback port, for the whole session."""
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A real Prefect API (the test harness: a server on a temporary SQLite database), started once
    per session for every test that runs a flow or a task.

    Tests share its state: one that reads flow runs, deployments or concurrency limits back filters
    by names of its own. Its URL is in Prefect's in-process settings, not in the environment: a
    subprocess that must reach it is given `PREFECT_API_URL` explicitly.
    """
    from prefect.testing.utilities import prefect_test_harness

    # 180 s: the server's first start migrates its database, which takes a minute on a busy machine
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def redis_client(redis_url: str):
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path / "lake")


@pytest.fixture(scope="session")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated generic-format log of ~1,500 requests over two hours."""
    from models.ingest.synthetic import SyntheticLogSpec, write_synthetic_log

    path = tmp_path_factory.mktemp("logs") / "requests.jsonl"
    write_synthetic_log(path, SyntheticLogSpec(days=2 / 24, requests_per_day=18_000, bursts=1))
    return path


@pytest.fixture(scope="session")
def mooncake_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Mooncake-format trace the project writes itself (tests run without ../shared)."""
    import random

    import orjson

    rng = random.Random(3)
    path = tmp_path_factory.mktemp("traces") / "mooncake_like.jsonl"
    lines, next_id, roots = [], 0, []
    for i in range(1200):
        shared = rng.choice(roots) if roots and rng.random() < 0.6 else []
        own = list(range(next_id, next_id + rng.randint(1, 6)))
        next_id += len(own)
        hashes = shared + own
        if len(roots) < 30:
            roots.append(hashes[:2])
        record = {
            "timestamp": i * 250 + rng.randint(0, 200),
            "input_length": len(hashes) * 512 - rng.randint(0, 511),
            "output_length": rng.randint(1, 500),
            "hash_ids": hashes,
        }
        lines.append(orjson.dumps(record))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GPT-2 (random weights, MiniLM tokenizer) saved once per session."""
    import torch

    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    return save_tiny_llm(tmp_path_factory.mktemp("llm") / "tiny")

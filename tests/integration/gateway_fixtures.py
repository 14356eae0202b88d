"""The gateway tests' fixtures (test_gateway*.py, through tests/integration/conftest.py): the tiny
GPT-2 and MiniLM, shared by the whole session, and a gateway over them per test module.

The model and MiniLM are only read (their weights; the model's turn lock is free between
requests), so loading them once for the session changes no test. The gateway is not shared: its
cache, counters and request stream are fresh for each module, as they were before the gateway
tests were split by theme; within a module, tests keep apart by `unique` prompts.

What the fixtures use is imported inside them, not at the top: the conftest imports this
module for every integration test, and torch, openai and the gateway are for these only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gateway_support import Running

    from models.serving.embeddings import MiniLM


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import torch

    from models.llm.backends import HFBackend
    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    directory = save_tiny_llm(tmp_path_factory.mktemp("llm") / "tiny-gpt2")
    backend = HFBackend.from_path(directory, device="cpu")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def minilm() -> MiniLM:
    from models.serving.embeddings import MiniLM

    return MiniLM(device="cpu")


@pytest.fixture(scope="module")
def gw(
    backend: Any, minilm: MiniLM, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    from gateway_support import start

    running, stop = start(backend, minilm, tmp_path_factory.mktemp("gw"), redis_url)
    yield running
    stop()

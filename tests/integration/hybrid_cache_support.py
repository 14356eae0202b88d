"""What the hybrid cache's test files share: an answer key, an immutable key, and three real tiers
(memory, SSD, Redis) over a flushed Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_runtime.keys import EmbeddingKey, ExactKey
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client


def k(prompt: str, tenant: str = "acme") -> ExactKey:
    """An answer: stored with its generations (a few dozen bytes more than its value)."""
    return ExactKey.of(tenant, "tiny-gpt2", prompt)


def e(text: str, tenant: str = "acme") -> EmbeddingKey:
    """An immutable entry, stored as given: for the tiers' mechanics and byte budgets, and what an
    invalidation of answers must leave alone."""
    return EmbeddingKey.of(tenant, "minilm", text)


@pytest.fixture
def three_tiers(tmp_path: Path, redis_url: str) -> Iterator[tuple[MemoryTier, SSDTier, RedisTier]]:
    client = redis_client(redis_url)
    client.flushdb()
    tiers = (MemoryTier(1000), SSDTier(tmp_path / "ssd", 10_000), RedisTier(client))
    yield tiers
    for tier in tiers:
        tier.close()

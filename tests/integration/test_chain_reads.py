"""KV chains are read in batches: one call per tier, read ahead in doubling chunks."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import FakeClock

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey, PrefixKey
from cache_runtime.kv_pages import PAGE_TOKENS, encode_page, load_prefix, page_keys, stream_prefix
from cache_runtime.services import RedisClusterServers
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
TOKENS = list(range(20 * PAGE_TOKENS + 5))  # 20 full pages and a partial tail


def counted(calls: list[Any], method: Callable[..., Any], name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, len(args[0]) if name.endswith("many") else 1))
        return method(*args, **kwargs)

    return call


@functools.cache  # one encoding per depth: safetensors' header order varies between calls
def page(depth: int) -> bytes:
    """A whole page of a 2-layer model: (1, heads=2, PAGE_TOKENS, head_dim=4) per tensor."""
    tensor = torch.full((1, 2, PAGE_TOKENS, 4), float(depth))
    return encode_page([(tensor, tensor + 0.5), (tensor - 1, tensor.clone())])


def store(tier: Any, keys: list[PrefixKey], depths: range) -> None:
    for depth in depths:
        parent = keys[depth - 1].to_string() if depth else None
        assert tier.put(keys[depth].to_string(), page(depth), parent=parent)


@pytest.fixture()
def three_tiers(tmp_path: Path, redis_url: str):
    client = redis_client(redis_url)
    tiers = [
        MemoryTier(64 * 1024 * 1024),
        SSDTier(tmp_path / "ssd", 64 * 1024 * 1024),
        RedisTier(client, namespace="chains"),
    ]
    cache = HybridCache(tiers, write_through=["memory", "redis"])
    yield cache, tiers
    client.flushdb()
    cache.close()


def test_a_chain_is_read_with_one_call_per_tier_and_promoted_in_order(three_tiers) -> None:
    cache, (memory, ssd, redis) = three_tiers
    keys = page_keys("acme", "m", TOKENS)
    store(memory, keys, range(0, 2))
    store(ssd, keys, range(2, 5))
    store(redis, keys, range(5, 8))
    store(redis, keys, range(9, 12))  # after the hole at 8: unusable
    calls: list[Any] = []
    for tier in (ssd, redis):
        tier.get = counted(calls, tier.get, f"{tier.name}.get")
        tier.get_many = counted(calls, tier.get_many, f"{tier.name}.get_many")

    chain = cache.get_chain(keys)

    assert [tier for _, tier in chain] == ["memory"] * 2 + ["ssd"] * 3 + ["redis"] * 3
    assert [value for value, _ in chain] == [page(depth) for depth in range(8)]
    # each tier asked once, only about what the tiers above lacked
    assert calls == [("ssd.get_many", 18), ("redis.get_many", 15)]
    # promoted into the top tier only (the SSD fills by demotion), in order, expiry kept
    assert all(memory.contains(key.to_string()) for key in keys[:8])
    assert [ssd.contains(key.to_string()) for key in keys[:8]] == [False] * 2 + [True] * 3 + [
        False
    ] * 3
    assert not memory.contains(keys[9].to_string())  # beyond the hole: never promoted
    assert cache.longest_prefix(keys) == 8


def test_a_promoted_page_keeps_its_expiry(three_tiers) -> None:
    cache, (memory, _, redis) = three_tiers
    keys = page_keys("acme", "m", TOKENS)[:3]
    assert redis.put(keys[0].to_string(), page(0))
    assert redis.put(keys[1].to_string(), page(1), ttl_s=60, parent=keys[0].to_string())
    assert redis.put(keys[2].to_string(), page(2), ttl_s=30, parent=keys[1].to_string())
    assert len(cache.get_chain(keys)) == 3
    left = [memory.ttl_left(key.to_string()) for key in keys]
    assert left[0] is None and 55 < left[1] <= 60 and 25 < left[2] <= 30


def test_longest_prefix_asks_each_tier_once(three_tiers) -> None:
    cache, (memory, _, redis) = three_tiers
    keys = page_keys("acme", "m", TOKENS)
    store(memory, keys, range(0, 3))
    store(redis, keys, range(3, 6))
    calls: list[Any] = []
    redis.contains = counted(calls, redis.contains, "redis.contains")
    redis.contains_many = counted(calls, redis.contains_many, "redis.contains_many")
    assert cache.longest_prefix(keys) == 6
    assert calls == [("redis.contains_many", 17)]


def test_the_ssd_reads_many_as_it_reads_one(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    batch, single = (SSDTier(tmp_path / name, 1 << 20, clock=clock) for name in ("a", "b"))
    keys = [ExactKey.of("acme", "m", f"q{i}").to_string() for i in range(6)]
    for tier in (batch, single):
        tier.put(keys[0], b"zero")
        tier.put(keys[1], b"one", ttl_s=5)
        tier.put(keys[2], b"two", ttl_s=50)
        tier.put(keys[4], b"four", pinned=True)
    clock.now += 10  # keys[1] expired; keys[3] and keys[5] never stored
    assert batch.get_many(keys) == [single.get(key) for key in keys]
    assert batch.get_many(keys) == [b"zero", None, b"two", None, b"four", None]
    first, second = batch.stats(), single.stats()
    assert (first.expirations, first.hits, first.misses) == (1, 6, 6)
    assert (second.expirations, second.hits, second.misses) == (1, 3, 3)
    assert batch.check() == [] and single.check() == []
    batch.close(), single.close()


def test_a_long_chain_is_read_from_redis_in_slices_kept_in_order(redis_url: str) -> None:
    from cache_runtime.tiers.redis_tier import MGET_KEYS

    client = redis_client(redis_url)
    tier = RedisTier(client, namespace="slices")
    keys = [ExactKey.of("acme", "m", f"q{i}").to_string() for i in range(2 * MGET_KEYS + 5)]
    for i, key in enumerate(keys):
        if i % 7:  # every seventh never stored: holes in every slice
            assert tier.put(key, f"v{i}".encode())
    expected = [f"v{i}".encode() if i % 7 else None for i in range(len(keys))]
    assert tier.get_many(keys) == expected
    assert tier.get_many(keys[:3]) == expected[:3]  # short reads: one plain MGET
    stats, held = tier.stats(), sum(value is not None for value in expected)
    assert (stats.hits, stats.misses, stats.errors) == (held + 2, len(keys) - held + 1, 0)
    client.flushdb()
    tier.close()


def test_redis_reads_many_on_a_cluster_and_degrades_when_it_is_gone() -> None:
    with RedisClusterServers(masters=3) as cluster:
        tier = RedisTier(redis_client(cluster.url, cluster=True))
        chains = [page_keys(f"t{n}", "m", TOKENS[: 4 * PAGE_TOKENS]) for n in range(6)]
        for chain in chains:
            store(tier, chain, range(4))
        firsts = [chain[0].to_string() for chain in chains]  # one per chain: several slots
        assert tier.get_many(firsts) == [page(0)] * 6
        assert tier.get_many([key.to_string() for key in chains[0]]) == [page(d) for d in range(4)]
        assert tier.stats().errors == 0
        cluster.stop()
        assert tier.get_many(firsts) == [None] * 6
        assert tier.stats().errors >= 1  # (the SCAN of `stats` itself fails too now)
        tier.close()


def test_stream_prefix_reads_ahead_in_doubling_chunks_and_stops_at_the_hole() -> None:
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    keys = page_keys("acme", "m", TOKENS)
    store(cache.tiers[0], keys, range(20))
    sizes: list[int] = []
    read = cache.get_chain
    cache.get_chain = lambda chunk, parent=None: sizes.append(len(chunk)) or read(chunk, parent)

    pages = list(stream_prefix(cache, "acme", "m", TOKENS, first_chunk=2, max_chunk=4))
    assert [p.key.depth for p in pages] == list(range(20)) and sizes == [2, 4, 4, 4, 4, 2]

    cache.delete(keys[5])
    sizes.clear()
    pages = list(stream_prefix(cache, "acme", "m", TOKENS, first_chunk=2, max_chunk=4))
    assert [p.key.depth for p in pages] == [0, 1, 2, 3, 4] and sizes == [2, 4]
    restored, covered = load_prefix(cache, "acme", "m", TOKENS, None)
    assert covered == 5 * PAGE_TOKENS
    layer = restored.layers[1]  # (1, heads, covered, head_dim), page d filled with d - 1
    assert layer.keys.shape == (1, 2, covered, 4)
    assert torch.equal(layer.keys[0, 0, :, 0], torch.arange(5.0).repeat_interleave(16) - 1)
    cache.close()


def test_a_reader_stopped_early_or_failing_leaves_no_thread_behind() -> None:
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    keys = page_keys("acme", "m", TOKENS)
    store(cache.tiers[0], keys, range(20))
    before = threading.active_count()
    streamed = stream_prefix(cache, "acme", "m", TOKENS)
    assert next(streamed).key == keys[0]
    streamed.close()
    assert threading.active_count() == before

    def broken(chunk: Any, parent: Any = None) -> Any:
        raise RuntimeError("a bug in a tier")

    cache.get_chain = broken
    with pytest.raises(RuntimeError, match="a bug in a tier"):
        list(stream_prefix(cache, "acme", "m", TOKENS))
    assert threading.active_count() == before
    with pytest.raises(ValueError, match="first_chunk"):
        list(stream_prefix(cache, "acme", "m", TOKENS, first_chunk=0))
    cache.close()

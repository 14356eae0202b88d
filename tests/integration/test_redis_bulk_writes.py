"""The Redis tier's pipelined bulk writes (`RedisTier.put_many` -> `MsetWriter`) against a real
Redis: several MSETs in flight on one connection, so every reply must be read in order and a refused
command must neither lose the others nor leave the connection out of step; and the bulk-write
benchmark, which must leave a configured Redis as it found it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from cache_runtime.keys import ExactKey
from cache_runtime.tiers import RedisTier, redis_client

pytestmark = pytest.mark.integration


def key(prompt: str, tenant: str = "acme") -> str:
    return ExactKey.of(tenant, "tiny-gpt2", prompt).to_string()


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_large_values_are_split_by_bytes_and_round_trip(redis_url: str) -> None:
    """Values past the inline size go unformatted into the command, and a command stops at
    `MSET_MAX_BYTES` (8 MiB) even below `bulk_batch` keys."""
    tier = RedisTier(redis_client(redis_url, socket_timeout_s=5), namespace=f"big{time.time_ns()}")
    pages = {key(f"page{i}"): bytes([i]) * (3 << 20) for i in range(6)}  # 3 MiB each
    small = {key(f"small{i}"): f"v{i}".encode() for i in range(10)}
    items = [(k, v, None) for k, v in (pages | small).items()]
    commands = list(tier._msets.commands([(k, v) for k, v, _ in items]))
    assert [count for count, _ in commands] == [3, 3, 10]  # cut once past 8 MiB
    assert tier.put_many(items) == 16
    assert all(tier.get(k) == v for k, v in (pages | small).items())
    assert tier.stats().errors == 0
    tier.close()


def test_a_refused_mset_loses_only_its_own_keys(redis_url: str, admin: redis.Redis) -> None:
    """An ACL user confined to one tenant: the MSET carrying another tenant's keys is refused
    (NOPERM), the ones before and after it are stored, and the connection stays usable."""
    admin.execute_command(
        "ACL", "SETUSER", "bulk-acme", "on", ">s3cret", "~bulkacl:acme:*", "+@all", "-@dangerous"
    )
    try:
        tier = RedisTier(
            redis_client(redis_url, username="bulk-acme", password="s3cret"),
            namespace="bulkacl",
            bulk_batch=2,
        )
        items = [(key(f"a{i}"), b"ok", None) for i in range(2)]
        items += [(key(f"g{i}", "globex"), b"forged", None) for i in range(2)]
        items += [(key(f"a{i}"), b"ok", None) for i in range(2, 5)]
        assert tier.put_many(items) == 5
        assert tier.stats().errors == 1
        assert [tier.get(key(f"a{i}")) for i in range(5)] == [b"ok"] * 5  # still in step
        assert admin.exists(tier.redis_key(key("g0", "globex"))) == 0
        tier.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "bulk-acme")


def test_a_due_health_check_does_not_read_an_mset_reply(redis_url: str) -> None:
    """Regression guard: with MSETs in flight a health-check PING would take an MSET's +OK for
    its PONG. A client whose health check is always due must still store every batch."""
    client = redis.Redis.from_url(redis_url, health_check_interval=1e-9, socket_timeout=5)
    tier = RedisTier(client, namespace="health", bulk_batch=10)
    items = [(key(f"h{i}"), b"v", None) for i in range(95)]
    assert tier.put_many(items) == 95
    assert tier.stats().errors == 0
    assert tier.get(key("h94")) == b"v"
    tier.close()


def test_the_bench_on_a_configured_redis_deletes_only_its_own_keys(
    redis_url: str, admin: redis.Redis
) -> None:
    """Regression: `preheat bench runtime` ran FLUSHDB on the Redis the settings name."""
    from models.evaluation.bench.runtime_bench import bench_redis

    admin.set("someone-elses", b"keep")
    result = bench_redis(redis_url, writes=3000, batch=1000, rounds=1)
    assert result["preheat_pipelined_writes_per_s"] > 0
    assert admin.get("someone-elses") == b"keep"
    assert not list(admin.scan_iter(match="bench:*"))
    admin.delete("someone-elses")


def test_a_key_given_twice_in_one_batch_keeps_its_last_entry(redis_url: str) -> None:
    """Regression: the TTL-less entries went out (MSET) before those with a TTL (pipeline), so
    an older entry with a TTL overwrote a newer one without; and the slices of two bulk
    connections, racing, could each write one key. Now the last entry of a key is its only
    write, whatever the mix, and the key is counted once."""
    tier = RedisTier(redis_client(redis_url), namespace="dedup", bulk_batch=100)
    rating = key("What is ACME's credit rating?")
    stored = tier.put_many([(rating, b"AA (old)", 3600.0), (rating, b"B (downgraded)", None)])
    assert tier.get(rating) == b"B (downgraded)" and tier.ttl_left(rating) is None
    assert stored == 1
    assert tier.put_many([(rating, b"B", None), (rating, b"CCC (today)", 60.0)]) == 1
    assert tier.get(rating) == b"CCC (today)" and 0 < (tier.ttl_left(rating) or 0) <= 60
    assert tier.stats().puts == 4
    tier.close()

    # every key in both halves of the batch: without deduplication each connection's slice
    # would hold one of its two writes
    tier = RedisTier(redis_client(redis_url), "dedup2", bulk_batch=100, bulk_connections=2)
    names = [key(f"d{i}") for i in range(1000)]
    items = [(name, b"old", None) for name in names] + [(name, b"new", None) for name in names]
    stored = tier.put_many(items)
    assert {tier.get(name) for name in names} == {b"new"}
    assert stored == 1000
    tier.close()


def test_a_refused_set_in_a_pipeline_loses_only_its_own_key(
    redis_url: str, admin: redis.Redis
) -> None:
    """Regression: the pipeline of entries with a TTL raised on its first refused SET, and
    `put_many` reported nothing stored although the others were. Each refusal is an error."""
    admin.execute_command(
        "ACL", "SETUSER", "ttl-acme", "on", ">s3cret", "~ttlacl:acme:*", "+@all", "-@dangerous"
    )
    try:
        tier = RedisTier(
            redis_client(redis_url, username="ttl-acme", password="s3cret"), namespace="ttlacl"
        )
        items = [(key(f"a{i}"), b"ok", 60.0) for i in range(3)]
        items += [(key(f"g{i}", "globex"), b"forged", 60.0) for i in range(2)]
        items += [(key("a3"), b"ok", None)]  # an MSET beside the pipeline
        assert tier.put_many(items) == 4
        assert tier.stats().errors == 2
        assert [tier.get(key(f"a{i}")) for i in range(4)] == [b"ok"] * 4
        assert admin.exists(tier.redis_key(key("g0", "globex"))) == 0
        tier.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "ttl-acme")

"""The Redis tier's pipelined bulk writes (`RedisTier.put_many` -> `_mset`) against a real Redis:
several MSETs in flight on one connection, so every reply must be read in order and a refused
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
    `_MSET_MAX_BYTES` (8 MiB) even below `bulk_batch` keys."""
    tier = RedisTier(redis_client(redis_url, socket_timeout_s=5), namespace=f"big{time.time_ns()}")
    pages = {key(f"page{i}"): bytes([i]) * (3 << 20) for i in range(6)}  # 3 MiB each
    small = {key(f"small{i}"): f"v{i}".encode() for i in range(10)}
    items = [(k, v, None) for k, v in (pages | small).items()]
    commands = list(tier._mset_commands([(k, v) for k, v, _ in items]))
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
    from flows.bench.runtime_bench import bench_redis

    admin.set("someone-elses", b"keep")
    result = bench_redis(redis_url, writes=3000, batch=1000, rounds=1)
    assert result["preheat_pipelined_writes_per_s"] > 0
    assert admin.get("someone-elses") == b"keep"
    assert not list(admin.scan_iter(match="bench:*"))
    admin.delete("someone-elses")

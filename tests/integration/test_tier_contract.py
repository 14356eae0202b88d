"""One contract, three tiers: memory, SSD and a real Redis behave alike where they must."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import FakeClock, wait_until
from redis.exceptions import RedisClusterException

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey, PrefixKey
from cache_runtime.services import RedisClusterServers
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, Tier, redis_client
from cache_runtime.tiers.redis_cluster import LazyRedisCluster

pytestmark = pytest.mark.integration
CAPACITY = 4 * 1024 * 1024


@pytest.fixture(params=["memory", "ssd", "redis"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    if request.param == "memory":
        made: Tier = MemoryTier(CAPACITY)
    elif request.param == "ssd":
        made = SSDTier(tmp_path / "ssd", CAPACITY)
    else:
        client = redis_client(request.getfixturevalue("redis_url"))
        client.flushdb()
        made = RedisTier(client, namespace=f"t{time.monotonic_ns()}")
    yield made
    made.close()


def key(prompt: str, tenant: str = "acme") -> str:
    return ExactKey.of(tenant, "tiny-gpt2", prompt).to_string()


def test_implements_the_protocol(tier: Tier) -> None:
    assert isinstance(tier, Tier)


def test_round_trip_of_exact_bytes(tier: Tier) -> None:
    for size in (0, 1, 4096, 1024 * 1024):
        value = bytes(i % 251 for i in range(size))
        assert tier.put(key(f"p{size}"), value)
        assert tier.get(key(f"p{size}")) == value


def test_miss_contains_delete(tier: Tier) -> None:
    assert tier.get(key("absent")) is None
    assert not tier.contains(key("absent"))
    assert tier.put(key("q"), b"answer")
    assert tier.contains(key("q"))
    assert tier.delete(key("q")) is True
    assert tier.delete(key("q")) is False
    assert tier.get(key("q")) is None


def test_overwrite_replaces(tier: Tier) -> None:
    tier.put(key("q"), b"old")
    tier.put(key("q"), b"new")
    assert tier.get(key("q")) == b"new"


def test_tenants_do_not_see_each_other(tier: Tier) -> None:
    tier.put(key("same prompt", "acme"), b"acme's answer")
    assert tier.get(key("same prompt", "globex")) is None
    tier.put(key("same prompt", "globex"), b"globex's answer")
    assert tier.get(key("same prompt", "acme")) == b"acme's answer"


def test_ttl_expires(tier: Tier) -> None:
    tier.put(key("short"), b"v", ttl_s=0.05)
    tier.put(key("long"), b"v", ttl_s=60)
    wait_until(lambda: tier.get(key("short")) is None)
    assert tier.get(key("long")) == b"v"


def test_stats_count_hits_misses_and_contents(tier: Tier) -> None:
    tier.put(key("a"), b"12345")
    tier.get(key("a"))
    tier.get(key("b"))
    stats = tier.stats()
    assert (stats.hits, stats.misses, stats.puts) == (1, 1, 1)
    assert (stats.items, stats.bytes) == (1, 5)


def test_check_is_clean_after_use(tier: Tier) -> None:
    pages = PrefixKey.chain("acme", "tiny-gpt2", [[1] * 16, [2] * 16])
    tier.put(pages[0].to_string(), b"page0")
    tier.put(pages[1].to_string(), b"page1", parent=pages[0].to_string())
    tier.delete(key("nothing"))
    assert tier.check() == []


def test_redis_tier_degrades_when_server_is_gone() -> None:
    from cache_runtime.services import RedisServer

    server = RedisServer().start()
    tier = RedisTier(redis_client(server.url, socket_timeout_s=0.2))
    assert tier.put(key("k"), b"v") and tier.get(key("k")) == b"v"
    server.stop()
    assert tier.get(key("k")) is None  # a miss, not an exception
    assert not tier.put(key("k2"), b"v")
    assert tier.check() and tier.check()[0].startswith("redis unreachable")
    assert tier.stats().errors >= 2
    restarted = RedisServer(port=server.port).start()
    try:
        wait_until(lambda: tier.put(key("k3"), b"again"))  # redis-py reconnects by itself
        assert tier.get(key("k3")) == b"again"
    finally:
        restarted.stop()


def test_redis_keys_are_namespaced_per_tenant(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    tier = RedisTier(client, namespace="ns")
    tier.put(key("x", "acme"), b"1")
    tier.put(key("x", "globex"), b"2")
    assert {k.decode().split(":")[1] for k in client.scan_iter(match="ns:*")} == {"acme", "globex"}
    assert tier.put_many([(key(f"bulk{i}"), b"v", None) for i in range(500)]) == 500


def test_redis_cluster_keeps_each_prefix_chain_on_one_slot(
    redis_cluster: RedisClusterServers,
) -> None:
    from redis.cluster import RedisCluster

    client = redis_client(redis_cluster.url, cluster=True)
    assert len(client.get_primaries()) == 3
    tier = RedisTier(client)
    chains = [
        PrefixKey.chain("acme", "tiny-gpt2", [[seed, d] * 8 for d in range(6)])
        for seed in range(20)
    ]
    slots_per_chain = []
    for chain in chains:
        parent = None
        for page in chain:
            assert tier.put(page.to_string(), f"{page.depth}".encode(), parent=parent)
            parent = page.to_string()
        slots = {client.keyslot(tier.redis_key(p.to_string())) for p in chain}
        slots_per_chain.append(len(slots))
        assert tier.get(chain[-1].to_string()) == b"5"
    assert slots_per_chain == [1] * 20
    used_nodes = {
        client.get_node_from_key(tier.redis_key(chain[0].to_string())).port for chain in chains
    }
    assert len(used_nodes) > 1  # chains spread over the masters; only a chain is co-located
    assert (
        tier.put_many(
            [(ExactKey.of("acme", "m", f"q{i}").to_string(), b"v", None) for i in range(50)]
        )
        == 50
    )
    assert isinstance(client.client(), RedisCluster) and tier.check() == []
    tier.close()


def test_a_cluster_tier_made_before_its_cluster_is_up_degrades_then_heals() -> None:
    """A serving process starts while no cluster node listens: its tier answers misses and
    refused writes, counted, and tries to build the cluster client again only when
    `retry_s` has passed (`clock`); once the cluster is up, the same tier round-trips."""
    clock = FakeClock()
    servers = RedisClusterServers(masters=3)  # its ports are chosen; nothing listens on them yet
    lazy = LazyRedisCluster(
        servers.url, retry_s=5.0, clock=clock, socket_timeout=0.5, socket_connect_timeout=0.5
    )
    tier = RedisTier(lazy, namespace="late")
    # the path a settings-built tier takes, healing on the real clock
    polled = RedisTier(redis_client(servers.url, cluster=True, cluster_retry_s=0.05), "polled")
    try:
        assert tier.get(key("q")) is None
        assert not tier.put(key("q"), b"answer")
        assert tier.put_many([(key("bulk"), b"v", None)]) == 0
        assert tier.contains_many([key("q")]) == [False]
        assert not tier.contains(key("q")) and not tier.delete(key("q"))
        errors = tier.stats().errors
        assert errors >= 6  # every call that reached for the cluster, and the stats' own SCAN
        (problem,) = tier.check()
        assert "redis cluster not connected" in problem and "Connection refused" in problem
        servers.start()
        assert tier.get(key("q")) is None  # up, but the next try is not due yet
        clock.now += 5.0
        # the cluster is built on the first call after its retry time: then q round-trips
        wait_until(lambda: tier.put(key("q"), b"answer"))
        assert tier.get(key("q")) == b"answer"
        errors = tier.stats().errors
        bulk = [(ExactKey.of("acme", "m", f"q{i}").to_string(), b"v", None) for i in range(50)]
        assert (
            tier.put_many(bulk) == 50 and tier.contains_many([k for k, _, _ in bulk]) == [True] * 50
        )
        assert tier.check() == [] and len(lazy.get_primaries()) == 3
        assert tier.stats().errors == errors and tier.stats().items == 51
        wait_until(lambda: polled.put(key("p"), b"polled"))
        assert polled.get(key("p")) == b"polled" and polled.check() == []
    finally:
        tier.close()
        polled.close()
        servers.stop()


def test_a_cluster_client_that_a_node_refuses_or_a_bad_url_raises_when_built(
    redis_url: str,
) -> None:
    """Configuration mistakes are not outages: they raise where the client is made."""
    with pytest.raises(RedisClusterException, match="Cluster mode is not enabled"):
        redis_client(redis_url, cluster=True)  # a standalone Redis: it answers, and refuses
    with pytest.raises(ValueError, match="no unix sockets"):
        redis_client("unix:///tmp/redis.sock", cluster=True)
    with pytest.raises(ValueError, match="only database 0"):
        redis_client(redis_url.rsplit("/", 1)[0] + "/3", cluster=True)


def test_touch_renews_or_clears_the_ttl(tier: Tier) -> None:
    tier.put(key("renew"), b"v", ttl_s=0.3)
    assert tier.touch(key("renew"), 60)
    tier.put(key("fixed"), b"v", ttl_s=0.05)
    wait_until(lambda: tier.get(key("fixed")) is None)
    assert tier.get(key("renew")) == b"v"
    assert tier.touch(key("renew"), None) and tier.get(key("renew")) == b"v"
    assert not tier.touch(key("absent"), 10)


def test_redis_bulk_writes_in_concurrent_batches(redis_url: str) -> None:
    tier = RedisTier(redis_client(redis_url), namespace="bulk", bulk_batch=1000, bulk_connections=2)
    items = [(key(f"bulk{i}"), f"v{i}".encode(), None) for i in range(5500)]
    items += [(key(f"ttl{i}"), b"t", 60.0) for i in range(300)]
    assert tier.put_many(items) == 5800
    assert tier.get(key("bulk4321")) == b"v4321" and tier.get(key("ttl7")) == b"t"
    assert tier.stats().puts == 5800 and tier.stats().items == 5800
    tier.close()


def test_redis_contains_many_answers_in_batches_and_degrades(redis_url: str) -> None:
    from cache_runtime.services import RedisServer

    tier = RedisTier(redis_client(redis_url), namespace="many", bulk_batch=3)
    tier.put(key("a"), b"1")
    tier.put(key("c"), b"3")
    asked = [key("a"), key("b"), key("c"), key("d"), key("a")]
    assert tier.contains_many(asked) == [True, False, True, False, True]
    assert tier.contains_many([]) == []
    tier.close()
    server = RedisServer().start()
    gone = RedisTier(redis_client(server.url, socket_timeout_s=0.2), bulk_batch=3)
    server.stop()
    assert gone.contains_many(asked) == [False] * 5  # a miss for each, not an exception
    assert gone.stats().errors >= 1


def test_redis_acl_user_is_confined_to_its_tenant_namespace(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command(
        "ACL", "SETUSER", "tenant-acme", "on", ">s3cret", "~acl:acme:*", "+@all", "-@dangerous"
    )
    try:
        tier = RedisTier(
            redis_client(redis_url, username="tenant-acme", password="s3cret"), namespace="acl"
        )
        assert tier.put(key("q", "acme"), b"acme's answer")
        assert tier.get(key("q", "acme")) == b"acme's answer"
        assert not tier.put(key("q", "globex"), b"forged")  # NOPERM: refused, not raised
        assert tier.get(key("q", "globex")) is None
        assert tier.stats().errors >= 2
        assert admin.get(tier.redis_key(key("q", "globex"))) is None
        # the generation counters live under the tenant's prefix too: answers work end to end
        cache = HybridCache([tier])
        assert cache.put(key("r", "acme"), b"rate", template="rates")
        assert cache.get(key("r", "acme"), template="rates") == b"rate"
        cache.invalidate_template("acme", "rates")
        cache.invalidate_tenant("acme")
        assert cache.get(key("r", "acme"), template="rates") is None
        assert cache.health() == {}
        tier.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "tenant-acme")
        admin.close()

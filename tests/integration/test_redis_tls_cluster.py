"""Redis Cluster over TLS, end to end: three masters, each behind its own TLS proxy (the nodes
announce the proxies, so a cluster client only ever speaks TLS), reached through `redis_client`
and `node_cache` exactly as production does, with certificate and hostname verification on. The
PKI and the proxy: redis_tls_pki.py and redis_tls_proxy.py; one node over TLS:
test_redis_tls.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from helpers import wait_until
from redis.cluster import RedisCluster
from redis.exceptions import MovedError, RedisClusterException
from redis_tls_pki import LOOPBACK, Leaf, Pki, issue
from redis_tls_proxy import TlsProxy, key

from cache_runtime.keys import PrefixKey
from cache_runtime.services import RedisClusterServers
from cache_runtime.settings import Settings
from cache_runtime.tiers import RedisTier, redis_client

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class TlsCluster:
    """A 3-master cluster whose nodes are reached through TLS proxies, and announce them.

    `proxies[i]` fronts `servers.nodes[i]`. Each node starts with `cluster-announce-ip`,
    `-port` (its proxy's) and `-bus-port` (its own bus: nodes gossip in plaintext, directly),
    so CLUSTER SLOTS and MOVED name the proxies, and a cluster client only ever speaks TLS.
    """

    servers: RedisClusterServers
    proxies: list[TlsProxy]

    @property
    def url(self) -> str:
        return f"rediss://{LOOPBACK}:{self.proxies[0].port}/0"

    def plain(self, i: int) -> redis.Redis:
        """A plaintext client on node `i`'s own port, behind the proxies' backs."""
        return redis.Redis(host=LOOPBACK, port=self.servers.nodes[i].port, socket_timeout=2)


def _slot_ports(node: redis.Redis) -> set[int]:
    return {int(owner[1]) for _low, _high, owner, *_replicas in node.cluster("SLOTS")}


@pytest.fixture(scope="module")
def tls_cluster(pki: Pki) -> Iterator[TlsCluster]:
    with contextlib.ExitStack() as stack:
        proxies: dict[int, TlsProxy] = {}

        def behind_a_proxy(port: int) -> tuple[str, ...]:
            proxy = proxies[port] = stack.enter_context(TlsProxy(port, pki.server))
            return (
                "--cluster-announce-ip", LOOPBACK,
                "--cluster-announce-port", str(proxy.port),
                "--cluster-announce-bus-port", str(port + 10000),
            )  # fmt: skip

        servers = stack.enter_context(RedisClusterServers(masters=3, node_args=behind_a_proxy))
        cluster = TlsCluster(servers, [proxies[node.port] for node in servers.nodes])
        nodes = [stack.enter_context(contextlib.closing(cluster.plain(i))) for i in range(3)]
        announced = {proxy.port for proxy in cluster.proxies}
        wait_until(lambda: all(_slot_ports(node) == announced for node in nodes))
        yield cluster


def _cluster_tier(url: str, ca: Path, namespace: str) -> RedisTier:
    client = redis_client(url, tls_ca_file=str(ca), socket_timeout_s=2, cluster=True)
    return RedisTier(client, namespace=namespace, bulk_batch=4)


def _keys_by_node(cluster: TlsCluster, namespace: str) -> list[set[str]]:
    """The keys of `namespace` that each node holds, read over plaintext on its own port."""
    held = []
    for i in range(3):
        with contextlib.closing(cluster.plain(i)) as node:
            held.append({k.decode() for k in node.scan_iter(match=f"{namespace}:*")})
    return held


def test_cluster_announces_its_tls_proxies(tls_cluster: TlsCluster) -> None:
    """What makes the cluster tests below honest: a key on another node is redirected to that
    node's proxy, never to its plaintext port."""
    proxy_ports = {proxy.port for proxy in tls_cluster.proxies}
    with contextlib.closing(tls_cluster.plain(0)) as node0:
        foreign = next(
            f"probe{i}"
            for i in range(1000)
            if node0.cluster("KEYSLOT", f"probe{i}") >= RedisClusterServers.SLOTS // 3
        )
        with pytest.raises(MovedError) as moved:
            node0.get(foreign)
    assert moved.value.port in proxy_ports - {tls_cluster.proxies[0].port}


def test_cluster_over_tls_round_trips(tls_cluster: TlsCluster, pki: Pki) -> None:
    tier = _cluster_tier(tls_cluster.url, pki.ca.cert_file, namespace="tlscluster")
    try:
        client = tier._client.client()  # the LazyRedisCluster's RedisCluster
        assert isinstance(client, RedisCluster)
        assert {n.port for n in client.get_nodes()} == {p.port for p in tls_cluster.proxies}
        assert all(
            n.redis_connection.connection_pool.connection_class is redis.SSLConnection
            for n in client.get_nodes()
        )
        # Answers, each tagged with its own key: spread over the slots, so over all masters.
        spread = [key(f"spread{i}") for i in range(30)]
        for i, k in enumerate(spread):
            assert tier.put(k, f"v{i}".encode())
        assert [tier.get(k) for k in spread] == [f"v{i}".encode() for i in range(30)]
        assert all(tier.contains(k) for k in spread)
        assert tier.delete(spread[0]) and not tier.delete(spread[0])
        assert tier.get(spread[0]) is None and not tier.contains(spread[0])
        # One KV prefix chain in bulk (pipelines of 4 SETs), one with a TTL: one hash tag.
        chain = PrefixKey.chain("acme", "tiny-gpt2", [[7, depth] * 8 for depth in range(6)])
        pages = [(page.to_string(), f"page{page.depth}".encode(), None) for page in chain]
        pages[-1] = (pages[-1][0], pages[-1][1], 60.0)
        assert tier.put_many(pages) == 6
        assert tier.get(chain[-1].to_string()) == b"page5"
        assert 0 < (tier.ttl_left(chain[-1].to_string()) or 0) <= 60
        asked = [page.to_string() for page in chain] + [key("absent"), spread[1]]
        assert tier.contains_many(asked) == [True] * 6 + [False, True]
        stats = tier.stats()
        assert (stats.errors, stats.items) == (0, 29 + 6)
        assert tier.check() == []
    finally:
        tier.close()
    # Where the keys really are, asked of each node over plaintext on its own port.
    held = _keys_by_node(tls_cluster, "tlscluster")
    assert sum(map(len, held)) == 35 and all(held), [len(keys) for keys in held]
    chain_keys = {tier.redis_key(page.to_string()) for page in chain}
    assert sum(1 for keys in held if keys & chain_keys) == 1  # the chain on one node


def test_a_cluster_client_with_the_wrong_ca_is_refused_when_built(
    tls_cluster: TlsCluster, pki: Pki
) -> None:
    """A cluster client tries to read the slot map when built, so a CA that does not sign the
    nodes' certificates fails there, naming why: the nodes answered, and this is a
    configuration mistake, not an outage (which would give a client that retries later); a
    standalone client would only fail on first use."""
    with pytest.raises(RedisClusterException, match="CERTIFICATE_VERIFY_FAILED"):
        redis_client(tls_cluster.url, tls_ca_file=str(pki.other_ca.cert_file), cluster=True)
    proxy = tls_cluster.proxies[0]
    wait_until(lambda: any("UNKNOWN_CA" in str(err) for err in proxy.rejected))


def test_settings_with_redis_cluster_give_the_node_cache_a_cluster_tier(
    tls_cluster: TlsCluster, pki: Pki, tmp_path: Path
) -> None:
    """`redis_cluster` (`PREHEAT_REDIS_CLUSTER`) makes `node_cache`'s Redis tier a cluster
    client: values land on every master, and each comes back through the cache."""
    from cache_runtime.node_cache import node_cache

    ca = quote(str(pki.ca.cert_file), safe="")
    settings = Settings(
        data_dir=tmp_path, redis_url=f"{tls_cluster.url}?ssl_ca_certs={ca}", redis_cluster=True
    )
    cache = node_cache(settings, memory_bytes=0, ssd_bytes=0, redis_namespace="settingscluster")
    try:
        (tier,) = cache.tiers
        assert isinstance(tier, RedisTier)
        spread = [key(f"settings{i}") for i in range(30)]
        for i, k in enumerate(spread):
            assert tier.put(k, f"v{i}".encode())
        assert [tier.get(k) for k in spread] == [f"v{i}".encode() for i in range(30)]
        assert tier.stats().errors == 0
    finally:
        cache.close()
    held = _keys_by_node(tls_cluster, "settingscluster")
    assert [len(keys) > 0 for keys in held] == [True] * 3 and sum(map(len, held)) == 30


@pytest.fixture
def other_ca_server(pki: Pki, tmp_path: Path) -> Leaf:
    return issue(pki.other_ca, tmp_path, "redis-rotated", ips=(LOOPBACK,))


def test_a_cluster_tier_degrades_when_the_nodes_certificates_stop_verifying(
    tls_cluster: TlsCluster, pki: Pki, other_ca_server: Leaf
) -> None:
    """The nodes' certificates are rotated to a CA this client does not trust, and its
    connections drop: each call is a miss or a refused write, counted, never an exception."""
    tier = _cluster_tier(tls_cluster.url, pki.ca.cert_file, namespace="tlsrotated")
    try:
        assert tier.put(key("q"), b"answer")
        for proxy in tls_cluster.proxies:
            proxy.present(other_ca_server)
        tier._client.disconnect_connection_pools()
        assert tier.get(key("q")) is None
        assert not tier.put(key("q2"), b"answer")
        assert not tier.contains(key("q"))
        assert tier.put_many([(key("bulk"), b"v", None)]) == 0
        assert tier.contains_many([key("q")]) == [False]
        assert tier.stats().errors >= 5
        (problem,) = tier.check()
        assert "CERTIFICATE_VERIFY_FAILED" in problem
    finally:
        for proxy in tls_cluster.proxies:
            proxy.present(pki.server)
        tier.close()

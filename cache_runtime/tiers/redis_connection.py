"""How the Redis tier connects: short timeouts, ACL user and password, standalone or Redis
Cluster, and TLS with the server's certificate always verified (`redis_client`).

Apart from `redis_tier.py` so that the tier's module is about what it stores; every tool that
talks to the cache's Redis (warm-up, benchmarks, the gateway) builds its client here.
"""

from __future__ import annotations

from typing import Any

import redis

from cache_runtime.tiers.redis_cluster import LazyRedisCluster, cluster_url_problem

# What a call to a Redis client raises when Redis fails: RedisClusterException is not a
# RedisError (a cluster client raises it once no node answers)
REDIS_ERRORS = (redis.RedisError, OSError, redis.exceptions.RedisClusterException)


def redis_client(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    socket_timeout_s: float = 0.5,
    cluster: bool = False,
    cluster_retry_s: float = 1.0,
) -> Any:
    """A client for the tier: short timeouts (a slow cache is a failing cache), ACL user and
    password, standalone or Redis Cluster, and TLS.

    TLS is on for a `rediss://` URL, and for a `redis://` URL given any `tls_*` file (the file
    says TLS is meant; a plaintext connection that carried the CA along would fail on first use).
    The server certificate is always verified, including its host name or IP (redis-py's
    defaults since 6.0, `ssl_cert_reqs="required"` and `ssl_check_hostname=True`, are passed
    explicitly all the same); `tls_ca_file` trusts a private CA instead of the system store,
    and `tls_cert_file` with `tls_key_file` present a client certificate (mutual TLS). The same
    `ssl_*` options can ride in the URL's query (`rediss://host:6380/0?ssl_ca_certs=/etc/ca.pem`),
    which is how a settings file's `redis_url` carries them; redis-py lets the query win over
    these arguments.

    A cluster client is a `LazyRedisCluster`: when no node answers yet it is built again at
    most every `cluster_retry_s` seconds, on use, and the tier counts each call meanwhile as
    an error. A node that answers and refuses us (an untrusted certificate, a wrong password,
    a node without cluster mode) raises here: that is a configuration mistake, not an outage.

    Raises:
        ValueError: TLS files with a `unix://` URL, only one of the client cert and key, or a
            cluster URL that is `unix://` or names a database other than 0.
        redis.exceptions.RedisClusterException: the cluster's nodes refused this client.
    """
    if cluster and (problem := cluster_url_problem(url)):
        raise ValueError(problem)
    if (tls_cert_file is None) != (tls_key_file is None):
        raise ValueError("tls_cert_file and tls_key_file go together (mutual TLS needs both)")
    options = _connection_options(username, password, socket_timeout_s)
    url = _with_tls(url, options, tls_ca_file, tls_cert_file, tls_key_file)
    if cluster:
        return LazyRedisCluster(url, retry_s=cluster_retry_s, **options)
    return redis.Redis.from_url(url, health_check_interval=10, **options)


def _connection_options(
    username: str | None, password: str | None, socket_timeout_s: float
) -> dict[str, Any]:
    """The client's credentials, timeouts and read size, TLS aside."""
    return {
        "username": username,
        "password": password,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        # A KV page is ~1.2 MB (GPT-2 small); reading replies 1 MiB a recv instead of redis-py's
        # 64 KiB took an MGET of 31 pages from 58 to 16 ms with hiredis (`preheat bench kv`)
        "socket_read_size": 1 << 20,
    }


def _with_tls(
    url: str,
    options: dict[str, Any],
    tls_ca_file: str | None,
    tls_cert_file: str | None,
    tls_key_file: str | None,
) -> str:
    """`url` with the TLS scheme when any `tls_*` file is given (which then join `options`),
    and certificate and host name verification added to `options` for any `rediss://` URL."""
    tls_files = {
        "ssl_ca_certs": tls_ca_file,
        "ssl_certfile": tls_cert_file,
        "ssl_keyfile": tls_key_file,
    }
    tls_files = {name: path for name, path in tls_files.items() if path}
    if tls_files:
        url = _tls_url(url)
        options.update(tls_files)
    if url.startswith("rediss://"):
        # Verification spelled out: redis-py before 6.0 did not check the host name by default
        options.update(ssl_cert_reqs="required", ssl_check_hostname=True)
    return url


def _tls_url(url: str) -> str:
    """`url` with the TLS scheme. redis-py picks the connection class from the scheme alone, and
    a plain connection given `ssl_*` options fails with a TypeError on every command."""
    if url.startswith("rediss://"):
        return url
    if url.startswith("redis://"):
        return "rediss://" + url.removeprefix("redis://")
    raise ValueError(f"TLS needs a redis:// or rediss:// URL, not {url.split(':', 1)[0]}://")

"""A Redis Cluster client that a serving process can start while the cluster is down.

redis-py's `RedisCluster` reads the slot map in its constructor and raises when no node answers;
`LazyRedisCluster` defers that, so the Redis tier degrades (misses, refused puts, counted errors)
instead of the process failing at start-up, and heals once a node answers.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

# A node answered and refused us: a configuration mistake, raised when the client is built
_REFUSALS = (
    ssl.SSLError,
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.ResponseError,
)


def cluster_url_problem(url: str) -> str | None:
    """Why `url` cannot start a Redis Cluster client (one line), or None: RedisCluster would
    raise for these when built, and a lazy build would hide them as an outage."""
    if url.startswith("unix://"):
        return "a Redis Cluster needs a redis:// or rediss:// URL (it has no unix sockets)"
    if redis.connection.parse_url(url).get("db", 0) != 0:
        return "a Redis Cluster has only database 0: drop the database from the URL"
    return None


class LazyRedisCluster:
    """A `RedisCluster` that does not need the cluster to be up when it is made.

    redis-py's RedisCluster reads the slot map in its constructor and raises when no node
    answers. This tries once when made; if no node answered, each later use builds it again,
    at most every `retry_s` seconds (`clock`: injectable), and until then every call raises a
    RedisClusterException, which the tier counts as an error. Once built, every attribute is
    the RedisCluster's, which rediscovers the cluster by itself after later outages.

    Rejected: building a RedisCluster on a failed start (its NodesManager has no slot map and
    no way to get one without the constructor); blocking callers on the build lock (a request
    waits for a connect timeout): a caller that finds a build in progress fails at once.
    """

    def __init__(
        self,
        url: str,
        *,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        **options: Any,
    ) -> None:
        """Raises the build's RedisClusterException when a node refused us (`_REFUSALS`)."""
        self._url, self._options = url, options
        self._retry_s, self._clock = retry_s, clock
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._failure: Exception | None = None
        self._next_try = clock()
        self._build()
        if self._failure is not None and _refused(self._failure):
            raise self._failure

    def client(self) -> Any:
        """The RedisCluster, built now if it is due; raises RedisClusterException if not."""
        cluster = self._cluster
        if cluster is not None:
            return cluster
        wait = self._next_try - self._clock()
        if wait <= 0 and self._lock.acquire(blocking=False):
            try:
                if self._cluster is None:
                    self._build()
            finally:
                self._lock.release()
            wait = self._next_try - self._clock()
        if self._cluster is not None:
            return self._cluster
        raise redis.exceptions.RedisClusterException(
            f"redis cluster not connected (next try in {max(wait, 0):.1f} s): {self._failure}"
        )

    def _build(self) -> None:
        from redis.cluster import RedisCluster

        try:
            self._cluster = RedisCluster.from_url(self._url, **self._options)
        except Exception as err:  # an empty slot map while a cluster forms is an IndexError
            self._failure = err
            self._next_try = self._clock() + self._retry_s

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.client(), name)

    def close(self) -> None:
        """Closes the RedisCluster if one was built (never builds one to close it)."""
        with self._lock:
            if self._cluster is not None:
                self._cluster.close()

    def __repr__(self) -> str:
        state = "connected" if self._cluster is not None else f"not connected: {self._failure}"
        return f"LazyRedisCluster({self._url!r}, {state})"


def _refused(err: BaseException) -> bool:
    """Whether a failed build reached a node that refused us (anywhere in the exception's
    chain: redis-py wraps the SSL or auth error in a ConnectionError, then a
    RedisClusterException), rather than finding no node to talk to."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, _REFUSALS):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False

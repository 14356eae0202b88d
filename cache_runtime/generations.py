"""Answer validity by generation counters: an answer is served only under the generations it was
computed in.

Each answer (an exact response, a semantic bucket) has three counters: its own key's, its
(tenant, template)'s and its tenant's. A lookup reads them (`read` -> a `Stamp`), the answer
computed after it is stored with that stamp, and a copy is served only while the counters still
read the same. `invalidate` is one increment of the right counter: every copy stamped before it,
in any tier of any process, stops matching at once; nothing has to be found and deleted, so no
copy in flight, no delayed write and no process that missed a message can bring an old answer
back. This is memcached's namespace keys, Django's cache versions and Rails' `cache_version`.

Every counter starts at a random 62-bit value the first time it is read (`SET NX`), instead of 0
beside one epoch id: a counter lost with its Redis (a restart with no persistence, `maxmemory`
eviction, an expiry, a failover that dropped a write) comes back at a new random value, so no old
stamp can match it by chance (2**-62). That is the issue's epoch, kept per counter, so it holds
on a Redis Cluster whose masters restart one at a time, where a single epoch key lives on only one
of them. An increment also starts from a random value when the counter is missing (one
transaction): a counter that only ever counted up from 1 after each loss would repeat itself.

Not a lease and no clocks: `invalidate` returns once Redis acknowledged the increment, and every
lookup that starts after that reads the new value. The price is one pipelined round trip per
answer lookup (with the Redis value read, when memory and SSD miss: `HybridCache`).

`RedisGenerations` is shared by every process of a deployment; `LocalGenerations` is for one
process with no Redis (nothing else can invalidate what it caches).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import redis

from cache_runtime.tiers.redis_connection import REDIS_ERRORS

Stamp = bytes  # the counters an answer was computed under, b"<key>.<template>.<tenant>"
UNTEMPLATED = "untemplated"  # the template scope of answers whose prompt has no template
ANSWER_KINDS = frozenset({"exact", "semantic"})  # keys that can go stale; the rest are immutable
_ORIGIN_BITS = 62  # random starting values stay far below INCR's 2**63 ceiling
# KEYS: the counter; ARGV: a random start, its PX in ms or 0 for none
_START_AND_INCR = """
if ARGV[2] == '0' then redis.call('SET', KEYS[1], ARGV[1], 'NX')
else redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) end
return redis.call('INCR', KEYS[1])
"""


_STAMP_MAGIC = b"g1:"


def stamped(stamp: Stamp, value: bytes) -> bytes:
    """An answer as the tiers hold it: its stamp, then its bytes (about 60 bytes more)."""
    return _STAMP_MAGIC + stamp + b"\n" + value


def unstamped(raw: bytes, stamp: Stamp) -> bytes | None:
    """The answer in `raw` if it was stored under `stamp`; None for any other copy (older,
    from counters since lost, or not an answer this cache wrote)."""
    head = _STAMP_MAGIC + stamp + b"\n"
    return raw[len(head) :] if raw.startswith(head) else None


class GenerationsUnavailable(RuntimeError):
    """The counters cannot be changed now (Redis unreachable): an invalidation did not happen."""


@dataclass(frozen=True, slots=True)
class AnswerScope:
    """What an answer's validity depends on: its key, its tenant's template, its tenant.

    `tenant_field` is the key string's tenant field as written (percent-encoded), so the
    counter names need no parse of the key."""

    key: str
    tenant_field: str
    template: str

    @classmethod
    def of(cls, key: str, template: str | None = None) -> AnswerScope:
        parts = key.split("|", 4)
        if len(parts) < 5 or parts[0] != "ph" or parts[2] not in ANSWER_KINDS or not parts[3]:
            raise ValueError(f"not an answer key (exact, semantic): {key[:80]!r}")
        return cls(key, parts[3], template or UNTEMPLATED)


def template_counter(tenant: str, template: str | None) -> tuple[str, str]:
    return ("template", f"{quote(tenant, safe='')}|{quote(template or UNTEMPLATED, safe='')}")


def tenant_counter(tenant: str) -> tuple[str, str]:
    return ("tenant", quote(tenant, safe=""))


def _counters(scope: AnswerScope) -> list[tuple[str, str]]:
    """(scope, name) of the three counters, in stamp order."""
    template = f"{scope.tenant_field}|{quote(scope.template, safe='')}"
    return [("key", scope.key), ("template", template), ("tenant", scope.tenant_field)]


def _origin() -> int:
    return secrets.randbits(_ORIGIN_BITS)


class Generations(Protocol):
    """Read an answer's generations; increment one counter."""

    def read(self, scope: AnswerScope, also_get: str | None = None) -> tuple[Stamp | None, Any]:
        """(the stamp now, or None if it cannot be read; the value of the Redis key `also_get`,
        read in the same round trip, for implementations that share the Redis tier's client)."""
        ...

    def bump(self, counter: tuple[str, str]) -> None:
        """Increment `counter` (`("key", key)`, `template_counter`, `tenant_counter`).

        Raises:
            GenerationsUnavailable: the increment cannot be shown to have happened."""
        ...

    def problem(self) -> str | None:
        """Why reads fail now (None when they work): for health checks."""
        ...


class LocalGenerations:
    """Counters in this process: for a cache no other process can invalidate. At most `limit`
    are kept (the oldest created goes first): a forgotten counter restarts at a random value,
    so its answers miss once, as after a Redis restart."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self._counters: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def _value(self, counter: tuple[str, str]) -> int:
        value = self._counters.get(counter)
        if value is None:
            value = self._counters[counter] = _origin()
            if len(self._counters) > self._limit:
                self._counters.popitem(last=False)
        return value

    def read(self, scope: AnswerScope, also_get: str | None = None) -> tuple[Stamp | None, Any]:
        with self._lock:
            values = [self._value(c) for c in _counters(scope)]
        return ".".join(map(str, values)).encode(), None

    def bump(self, counter: tuple[str, str]) -> None:
        with self._lock:
            self._counters[counter] = self._value(counter) + 1

    def problem(self) -> str | None:
        return None


class RedisGenerations:
    """Counters in Redis, shared by every process of a deployment (standalone or Cluster).

    Names: `<namespace>:<tenant>:{<key>}:gen` for a key (the hash tag is the answer's own on a
    Cluster, `RedisTier.redis_key`, so an answer and its counter share a slot and a node),
    `<namespace>:<tenant>:gen-template:<template>` and `<namespace>:<tenant>:gen-tenant`: all
    within the tenant's key pattern, for a tenant's ACL user.
    A key's counter expires `key_ttl_s` after it was created (one per answer looked up would
    otherwise stay forever); an expired one restarts at a random value, so an answer older
    than that misses once. The template and tenant counters are few and do not expire."""

    def __init__(
        self,
        client: Any,
        namespace: str = "preheat",
        key_ttl_s: float = 7 * 86400,
        retry_s: float = 0.5,
    ) -> None:
        """`retry_s`: after a failed read, answers miss without asking Redis for this long (a
        Redis that stopped answering would otherwise cost every lookup its socket timeout)."""
        if not key_ttl_s > 0:
            raise ValueError("key_ttl_s must be positive")
        self.client = client
        self.namespace = namespace
        self._key_ttl_ms = int(key_ttl_s * 1000)
        self._retry_s = retry_s
        self._problem: str | None = None
        self._down_until = 0.0
        # by type, as `RedisTier` does: a LazyRedisCluster must not be asked to build itself
        self._standalone = isinstance(client, redis.Redis)

    def _name(self, counter: tuple[str, str]) -> str:
        """Every counter under its tenant's `<namespace>:<tenant>:` prefix, where a tenant's
        ACL user may be limited to (`RedisTier`)."""
        scope, name = counter
        if scope == "key":
            tenant = name.split("|", 4)[3]
            return f"{self.namespace}:{tenant}:{{{name}}}:gen"
        if scope == "template":
            tenant, template = name.split("|", 1)
            return f"{self.namespace}:{tenant}:gen-template:{template}"
        return f"{self.namespace}:{name}:gen-tenant"

    def read(self, scope: AnswerScope, also_get: str | None = None) -> tuple[Stamp | None, Any]:
        if self._problem is not None and time.monotonic() < self._down_until:
            return None, None
        counters = _counters(scope)
        names = [self._name(c) for c in counters]
        wanted = names if also_get is None else [*names, also_get]
        try:
            if self._standalone:  # one command: cheaper than a pipeline of four in redis-py
                replies = self.client.mget(wanted)
            else:  # a Cluster's MGET needs one slot: a pipeline reaches each node once
                pipe = self.client.pipeline(transaction=False)
                for name in wanted:
                    pipe.get(name)
                replies = pipe.execute()
            values: list[Any] = replies[: len(names)]
            missing = [i for i, value in enumerate(values) if value is None]
            if missing:  # first read of these counters: start them at random values
                values = self._start(counters, names, values, missing)
        except REDIS_ERRORS as error:
            self._failed(error)
            return None, None
        self._problem = None
        if any(value is None for value in values):
            return None, None  # lost again between two commands (a restart): cannot tell
        stamp = b".".join(v if isinstance(v, bytes) else str(v).encode() for v in values)
        return stamp, replies[len(names)] if also_get is not None else None

    def _start(
        self,
        counters: Sequence[tuple[str, str]],
        names: Sequence[str],
        values: list[Any],
        missing: Sequence[int],
    ) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for i in missing:
            ttl = self._key_ttl_ms if counters[i][0] == "key" else None
            pipe.set(names[i], _origin(), nx=True, px=ttl)
            pipe.get(names[i])
        replies = pipe.execute()
        started = list(values)
        for n, i in enumerate(missing):
            started[i] = replies[2 * n + 1]
        return started

    def bump(self, counter: tuple[str, str]) -> None:
        name = self._name(counter)
        ttl = self._key_ttl_ms if counter[0] == "key" else 0
        try:  # one script on one key (one slot): a restart cannot fall between SET and INCR
            self.client.eval(_START_AND_INCR, 1, name, _origin(), ttl)
        except REDIS_ERRORS as error:
            self._failed(error)
            raise GenerationsUnavailable(
                f"the invalidation did not happen: {error}; retry when Redis is back"
            ) from error
        self._problem = None

    def _failed(self, error: BaseException) -> None:
        self._problem = f"redis unreachable for generations: {error}"
        self._down_until = time.monotonic() + self._retry_s

    def problem(self) -> str | None:
        """A live probe (a PING), at most once per `retry_s` while Redis is down."""
        if self._problem is not None and time.monotonic() < self._down_until:
            return self._problem
        try:
            self.client.ping()
        except REDIS_ERRORS as error:
            self._failed(error)
            return self._problem
        self._problem = None
        return None

"""The Redis tier: shared by all serving nodes; TTLs, per-tenant namespaces, pipelined bulk writes.

Redis keys are `<namespace>:<tenant>:<cache key string>` (see `redis_key`), so an ACL user of
one tenant can be limited to `~<namespace>:<tenant>:*` and one tenant's keys can be listed or
flushed alone.
Every backend failure (connection refused, timeout, server restarting) is counted and answered
as a miss or a refused put; redis-py reconnects on the next call, so the tier heals by itself.
That holds from start-up on: a Redis Cluster that no node answers for yet is built later
(`LazyRedisCluster`), so a serving process starts with a degraded cache, not a crash.

An answer's delete leaves a tombstone beside it (`<redis key>:invalidated`, the Redis server's
time of the delete, for `tombstone_ttl_s`), and `put_unless_invalidated` writes an answer only
if no tombstone is as recent as the lookup it was computed from, checked and written in one
server-side script: an answer computed before an invalidation can then never land in Redis
after it, from any process, even one that dies before it could clean up. Answer keys carry
their whole key as a hash tag, so the tombstone lives on the same Redis Cluster slot.

Redis evicts on its own (`maxmemory-policy`): `pinned` entries are written without a TTL, which
keeps them under the `volatile-*` policies; under `allkeys-*` nothing can be pinned in Redis,
which is why pinned entries belong in the memory or SSD tier as well.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import redis

from cache_runtime.tiers.base import TierStats
from cache_runtime.tiers.redis_cluster import LazyRedisCluster, cluster_url_problem
from cache_runtime.tiers.suspects import SuspectKeys

# RedisClusterException is not a RedisError: a cluster client raises it once no node answers
_ERRORS = (redis.RedisError, OSError, redis.exceptions.RedisClusterException)
_MSET_MAX_BYTES = 8 << 20  # per MSET command (see `RedisTier._mset_commands`)
_INLINE_VALUE_BYTES = 64 << 10  # larger values are not copied into their entry
_SUSPECT_LIMIT = 1_000_000  # suspect keys remembered before every read misses (`SuspectKeys`)
_SUSPECT_RETRY_S = 1.0
_ANSWER_KINDS = ("exact", "semantic")  # keys that can go stale: their deletes leave tombstones
_TOMBSTONE_SUFFIX = ":invalidated"
PutOutcome = Literal["stored", "invalidated", "failed"]

# Delete an answer and mark when (KEYS: the answer, its tombstone; ARGV: the tombstone's TTL in
# ms); returns {deleted count, the mark or false}. The DEL goes first and the SET is allowed to
# fail: a Redis out of memory (`noeviction`) refuses the SET, and the DEL must still happen. The
# time is the server's, in microseconds, built as a string: a Lua number would be printed with
# 14 significant digits.
_DELETE_AND_MARK = """
local deleted = redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local mark = t[1] .. string.format('%06d', tonumber(t[2]))
local set = redis.pcall('SET', KEYS[2], mark, 'PX', ARGV[1])
if type(set) == 'table' and set.err then return {deleted, false} end
return {deleted, mark}
"""
# Write an answer unless it was invalidated at or after `since` (KEYS: the answer, its
# tombstone; ARGV: the value, PX in ms or '0' for none, since in microseconds of the wall
# clock, the oldest lookup accepted in microseconds (older than the tombstones last, it cannot
# be checked), and a mark to accept (this process's own invalidation, for its refill) or '').
# Returns 1 if written.
_SET_UNLESS_INVALIDATED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local since = tonumber(ARGV[3])
if now - since > tonumber(ARGV[4]) then return 0 end
local mark = redis.call('GET', KEYS[2])
if mark and mark ~= ARGV[5] and tonumber(mark) >= since then return 0 end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""
_UNSETTLED = 2**63  # an own delete whose cache has not finished it: no lookup comes after it
_OWN_MARKS_LIMIT = 100_000  # marks of this tier's latest deletes (see `put_unless_invalidated`)
_MIN_TOMBSTONE_TTL_S = 60.0  # a lookup must fit in it, with the caller's clock skew allowance


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
    options: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
    }
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
    if cluster:
        return LazyRedisCluster(url, retry_s=cluster_retry_s, **options)
    return redis.Redis.from_url(url, health_check_interval=10, **options)


def _tls_url(url: str) -> str:
    """`url` with the TLS scheme. redis-py picks the connection class from the scheme alone, and
    a plain connection given `ssl_*` options fails with a TypeError on every command."""
    if url.startswith("rediss://"):
        return url
    if url.startswith("redis://"):
        return "rediss://" + url.removeprefix("redis://")
    raise ValueError(f"TLS needs a redis:// or rediss:// URL, not {url.split(':', 1)[0]}://")


class RedisTier:
    """A tier in Redis under `namespace`; `client` is a redis-py client (standalone or cluster:
    a `RedisCluster` or a `LazyRedisCluster`)."""

    shared = True  # every process sees the same entries (see `HybridCache`'s invalidation feed)

    def __init__(
        self,
        client: Any,
        namespace: str = "preheat",
        name: str = "redis",
        bulk_batch: int = 1000,
        bulk_connections: int = 1,
        tombstone_ttl_s: float = 3600.0,
    ) -> None:
        """`tombstone_ttl_s`: how long an answer's delete is remembered (see the module
        docstring); `put_unless_invalidated` refuses lookups older than that.

        `bulk_batch` keys per MSET (and per pipeline otherwise); `put_many` spreads its
        entries over `bulk_connections` connections at once.

        Each connection pipelines its MSETs (see `_mset`), which by itself overlaps this
        process's encoding with Redis's execution, so small batches keep both busy and one
        connection suffices. Measured on 2 cores against a local Redis, 100 B values, median of
        15 (keys/s): 1,000 keys x 1 connection 1,031k, x 2 980k; 2,000 x 1 1,018k, x 2 885k;
        5,000 x 2 (the previous default, before pipelining) 656k. A second connection adds
        GIL hand-offs and no overlap here; it may pay against a remote Redis (not measured).
        """
        if ":" in namespace or not namespace:
            raise ValueError("namespace must be non-empty and contain no ':'")
        if not tombstone_ttl_s >= _MIN_TOMBSTONE_TTL_S:
            raise ValueError(f"tombstone_ttl_s must be at least {_MIN_TOMBSTONE_TTL_S:g}")
        self.tombstone_ttl_s = tombstone_ttl_s
        self._mark_ms = max(1, int(tombstone_ttl_s * 1000))
        # key -> (the mark of this tier's last delete of it, monotonic_ns its cache settled it)
        self._own_marks: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._own_marks_lock = threading.Lock()
        self.name = name
        self.namespace = namespace
        self._client = client
        # Standalone by type, not by a `connection_pool` attribute: asking a LazyRedisCluster
        # for one would try to build the cluster (and raise while it is down)
        self._standalone = isinstance(client, redis.Redis)
        # Keys whose put or delete failed: absent here until a pipelined DEL of them gets
        # through (see `SuspectKeys`)
        self._suspects = SuspectKeys(
            self._delete_all, _SUSPECT_RETRY_S, batch=bulk_batch * 10, limit=_SUSPECT_LIMIT
        )
        self._stats = TierStats()
        self._stats_lock = threading.Lock()
        self._bulk_batch = bulk_batch
        self._bulk_connections = bulk_connections
        self._bulk_pool = (
            ThreadPoolExecutor(bulk_connections, thread_name_prefix="preheat-redis-bulk")
            if bulk_connections > 1
            else None
        )

    def redis_key(self, key: str) -> str:
        """`<namespace>:<tenant>:<key>`; KV pages get a `{<chain root>}` hash tag so that every
        page of one prefix chain lives on one Redis Cluster slot. On a cluster, answers (exact,
        semantic) get the tag `{<key>}`, so that their tombstone (`<redis key>:invalidated`)
        shares their slot; the key's fields are percent-encoded, so no brace of its own can end
        the tag early. Standalone, they keep their untagged names (no slots to share).

        Read straight off the key string rather than parsed: the tenant field is already
        percent-encoded (no ':' or braces can appear in it), and a prefix key's last field is
        its chain root. This runs once per key in bulk writes, where a full parse cost more
        than the network.
        """
        parts = key.split("|", 4)
        if len(parts) < 5 or parts[0] != "ph" or not parts[3]:
            return f"{self.namespace}:_:{key}"  # not a cache key (tools, tests): never a tenant's
        if parts[2] == "prefix":
            return f"{self.namespace}:{parts[3]}:{{{key.rsplit('|', 1)[1]}}}:{key}"
        if parts[2] in _ANSWER_KINDS and not self._standalone:
            return f"{self.namespace}:{parts[3]}:{{{key}}}"
        return f"{self.namespace}:{parts[3]}:{key}"

    def _tombstone(self, key: str, name: str) -> str | None:
        """The tombstone's Redis key of the answer `key` (Redis key `name`); None for keys that
        cannot go stale (KV pages) and keys that are not cache keys."""
        parts = key.split("|", 4)
        if len(parts) == 5 and parts[0] == "ph" and parts[3] and parts[2] in _ANSWER_KINDS:
            return name + _TOMBSTONE_SUFFIX
        return None

    def get(self, key: str) -> bytes | None:
        if self._suspects and self._suspects.holds(key):
            self._stats.misses += 1
            return None
        try:
            value = self._client.get(self.redis_key(key))
        except _ERRORS:
            self._count_error()
            self._stats.misses += 1
            return None
        if value is None:
            self._stats.misses += 1
        else:
            self._stats.hits += 1
        return value

    def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl_s: float | None = None,
        pinned: bool = False,
        parent: str | None = None,
        hint: str | None = None,
    ) -> bool:
        """A put that fails leaves the key a suspect (see `_suspects`): Redis may still hold
        an older value of it. Bulk `put_many` failures are counted, not tracked per key (a
        warm-up rewrites what it warms; the per-request path is this one)."""
        if self.put_many([(key, value, ttl_s)]) == 1:
            return True
        self._suspects.add([key])
        return False

    def put_unless_invalidated(
        self,
        key: str,
        value: bytes,
        *,
        ttl_s: float | None,
        since_s: float,
        own_mark: str = "",
    ) -> PutOutcome:
        """Write the answer `key` unless it was invalidated at or after `since_s` (wall-clock
        seconds: when the lookup that `value` was computed from began, less the clock skew the
        caller allows), by any process; check and write run as one script on the server.
        "invalidated" also for a lookup older than `tombstone_ttl_s` (its tombstone may be
        gone). A failure leaves the key a suspect, as `put` does.

        `own_mark`: a tombstone that does not count (`own_mark(key, looked_up_ns)`: this tier's
        own last delete of the key, complete in every tier of its cache before the lookup, on
        one clock, with no skew to allow; the caller reads it under its copy lock, right after
        its fences showed no delete of the key running). Without
        it the skew allowance would refuse the refill of an invalidation, and every answer
        looked up in the second after it, in the very process that invalidated. A delete since,
        by anyone, leaves another tombstone, which still refuses it.

        Raises:
            ValueError: `key` is not an answer (only answers have tombstones).
        """
        name = self.redis_key(key)
        tombstone = self._tombstone(key, name)
        if tombstone is None:
            raise ValueError(f"only answers (exact, semantic) have tombstones: {key[:80]!r}")
        with self._stats_lock:
            self._stats.puts += 1
        if self._suspects and self._suspects.holds(key):
            return "failed"  # Redis may still hold an older value: not written over
        px = "0" if ttl_s is None else str(max(1, int(ttl_s * 1000)))
        oldest = int(self.tombstone_ttl_s * 1e6)
        try:
            written = self._client.eval(
                _SET_UNLESS_INVALIDATED, 2, name, tombstone,
                value, px, int(since_s * 1e6), oldest, own_mark,
            )  # fmt: skip
        except _ERRORS:
            self._count_error()
            self._suspects.add([key])
            return "failed"
        return "stored" if written else "invalidated"

    def put_many(self, items: Iterable[tuple[str, bytes, float | None]]) -> int:
        """Bulk writes (warm-up); returns how many keys were stored.

        Entries without a TTL go as pipelined MSETs (`_mset`) over `bulk_connections`
        connections at once; entries with a TTL, and everything on a Redis Cluster (an MSET
        needs all its keys in one slot), go through redis-py pipelines of `bulk_batch` SETs.

        A key given more than once is written once, with its last entry, and counted once:
        the MSETs go before the pipelines and the slices of different connections run
        concurrently, so two writes of one key could land in either order (an older entry
        with a TTL would overwrite a newer one without). Deduplicating before the batch is
        split makes every key's write the only one, so no order between them matters.
        Cheap on the common path: a TTL-less batch without repeats is gathered straight into
        the dict the MSETs read (measured 0.5 ms more per 20,000 entries than a list, ~2% of
        writing them); only a batch with TTLs or repeated keys is walked a second time.
        """
        batch = list(items)
        with self._stats_lock:
            self._stats.puts += len(batch)
        if self._suspects:  # a key that may still hold an older value is not written over
            self._suspects.retry()
            batch = [item for item in batch if not self._suspects.holds(item[0], retry=False)]
        if not self._standalone:
            stored, rest = 0, list({item[0]: item for item in batch}.values())
        else:  # MSETs for the TTL-less
            plain = {key: value for key, value, ttl in batch if ttl is None}
            rest = []
            if len(plain) < len(batch):  # TTLs or repeated keys: the last entry of each key
                latest = {item[0]: item for item in batch}.values()
                plain = {key: value for key, value, ttl in latest if ttl is None}
                rest = [item for item in latest if item[2] is not None]
            stored = self._mset_concurrently(plain) if plain else 0
        for low in range(0, len(rest), self._bulk_batch):
            stored += self._pipeline_sets(rest[low : low + self._bulk_batch])
        return stored

    def _pipeline_sets(self, batch: list[tuple[str, bytes, float | None]]) -> int:
        """One pipeline of SETs; returns how many were stored. A SET refused (NOPERM, OOM)
        costs only its own key: the pipeline reports each reply rather than raising on the
        first error, which would report the stored ones as lost. Each refusal counts as an
        error; an error of the connection, which loses the whole pipeline, counts once."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for key, value, ttl_s in batch:
                px = None if ttl_s is None else max(1, int(ttl_s * 1000))
                pipe.set(self.redis_key(key), value, px=px)
            replies = pipe.execute(raise_on_error=False)
        except _ERRORS:
            self._count_error()
            return 0
        refused = sum(1 for reply in replies if isinstance(reply, Exception))
        if refused:
            self._count_error(refused)
        return sum(1 for reply in replies if reply and not isinstance(reply, Exception))

    def _mset_concurrently(self, values: dict[str, bytes]) -> int:
        """`values` in contiguous slices, one per bulk connection, each pipelined by `_mset`.

        A slice per connection rather than a batch per task: each connection then keeps its
        MSETs in flight back to back, and a put of one batch or less never changes thread.
        One key per dict entry, so no two slices write the same key.
        """
        slices = 1 if self._bulk_pool is None else self._bulk_connections
        slices = min(slices, -(-len(values) // self._bulk_batch))
        if slices < 2:
            return self._mset(values.items())
        pairs = list(values.items())
        size = -(-len(pairs) // slices)
        parts = [pairs[low : low + size] for low in range(0, len(pairs), size)]
        assert self._bulk_pool is not None
        return sum(self._bulk_pool.map(self._mset, parts))

    def _mset(self, pairs: Iterable[tuple[str, bytes]]) -> int:
        """MSETs of up to `bulk_batch` keys on one pooled connection, pipelined: each is sent as
        soon as it is encoded and the replies are read at the end, so encoding the next batch
        (which holds the GIL) overlaps Redis executing the previous one. Returns how many keys
        were stored; failures are counted, never raised.

        Encoded here rather than through redis-py: its per-command packing costs more than
        Redis takes to execute the command (measured 90k SETs/s through a redis-py pipeline,
        575k keys/s with one MSET per round trip). Rejected: one MSET per round trip (the
        client idles while Redis executes, and Redis while the client encodes).
        """
        pool = self._client.connection_pool
        try:
            connection = pool.get_connection()
        except _ERRORS:
            self._count_error()
            return 0
        sent: list[int] = []
        stored = refused = 0
        try:
            for count, command in self._mset_commands(pairs):
                # Health checks only before the first: a PING sent with replies outstanding
                # would read an MSET's reply as its own.
                connection.send_packed_command([command], check_health=not sent)
                sent.append(count)
            for count in sent:
                try:
                    connection.read_response()
                except redis.ResponseError:  # refused (NOPERM, OOM); the stream stays in step
                    refused += 1
                else:
                    stored += count
        except _ERRORS:
            connection.disconnect()  # replies outstanding: never reuse this connection
            self._count_error()
            return stored
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        if refused:
            self._count_error()
        return stored

    def _mset_commands(self, pairs: Iterable[tuple[str, bytes]]) -> Iterator[tuple[int, bytes]]:
        """(key count, packed MSET) for each `bulk_batch` keys, or fewer where the command
        would pass `_MSET_MAX_BYTES` of values (KV pages are large: one command of
        `bulk_batch` pages would hold Redis's event loop, and this process's memory, too long).

        One `%`-format per entry and one join per command: measured the fastest pure-Python
        packing (0.38 us per 100 B entry; a flat list of header/value pieces joined with
        CRLF took 0.51 us). A value over `_INLINE_VALUE_BYTES` is not formatted into its
        entry, so the join is its only copy.
        """
        redis_key, batch_keys = self.redis_key, self._bulk_batch
        parts: list[bytes] = [b""]  # [0]: the command header, known once the batch is cut
        count = size = 0
        for key, value in pairs:
            name = redis_key(key).encode()
            if len(value) < _INLINE_VALUE_BYTES:
                parts.append(b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(name), name, len(value), value))
            else:
                parts += (b"$%d\r\n%s\r\n$%d\r\n" % (len(name), name, len(value)), value, b"\r\n")
            count += 1
            size += len(value)
            if count == batch_keys or size >= _MSET_MAX_BYTES:
                parts[0] = b"*%d\r\n$4\r\nMSET\r\n" % (2 * count + 1)
                yield count, b"".join(parts)
                parts, count, size = [b""], 0, 0
        if count:
            parts[0] = b"*%d\r\n$4\r\nMSET\r\n" % (2 * count + 1)
            yield count, b"".join(parts)

    def _count_error(self, count: int = 1) -> None:
        with self._stats_lock:
            self._stats.errors += count

    def delete(self, key: str, *, mark: bool = True) -> bool:
        """An answer's delete leaves its tombstone (see the module docstring) unless `mark` is
        False: a copy cleared because a newer value went elsewhere is no invalidation, and its
        tombstone would refuse other processes' fresh answers."""
        name = self.redis_key(key)
        tombstone = self._tombstone(key, name) if mark else None
        try:
            if tombstone is None:
                deleted = bool(self._client.delete(name))
            else:
                count, stamp = self._client.eval(
                    _DELETE_AND_MARK, 2, name, tombstone, self._mark_ms
                )
                deleted = bool(count)
                if stamp:
                    self._remember_mark(key, stamp)
        except _ERRORS:
            self._count_error()
            self._suspects.add([key])
            return False
        self._suspects.discard(key)
        return deleted

    def own_mark(self, key: str, looked_up_ns: int) -> str:
        """The tombstone this tier's last delete of `key` left, if its cache settled that
        delete (`settle`) before `looked_up_ns` (monotonic); else "" (see
        `put_unless_invalidated`)."""
        with self._own_marks_lock:
            mark, settled_ns = self._own_marks.get(key, ("", _UNSETTLED))
        return mark if settled_ns < looked_up_ns else ""

    def settle(self, key: str) -> None:
        """Its cache's delete of `key` is complete in every tier: lookups from now on read no
        old copy, so the tombstone of this tier's last delete of it need not refuse them."""
        with self._own_marks_lock:
            if key in self._own_marks:
                self._own_marks[key] = (self._own_marks[key][0], time.monotonic_ns())

    def _remember_mark(self, key: str, stamp: bytes | str) -> None:
        with self._own_marks_lock:
            mark = stamp.decode() if isinstance(stamp, bytes) else stamp
            self._own_marks[key] = (mark, _UNSETTLED)  # until its cache settles it
            self._own_marks.move_to_end(key)
            if len(self._own_marks) > _OWN_MARKS_LIMIT:
                self._own_marks.popitem(last=False)

    def _delete_all(self, keys: list[str]) -> bool:
        """One pipeline of DELs (the suspects' drop; answers leave tombstones, as in `delete`);
        False, counted, if it failed. A cluster pipeline cannot run scripts: there the answers
        go one script call each (suspects are few: keys whose writes failed lately)."""
        try:
            pipe = self._client.pipeline(transaction=False)
            marked = []
            for key in keys:
                name = self.redis_key(key)
                tombstone = self._tombstone(key, name)
                if tombstone is None:
                    pipe.delete(name)
                elif self._standalone:
                    pipe.eval(_DELETE_AND_MARK, 2, name, tombstone, self._mark_ms)
                else:
                    marked.append((name, tombstone))
            pipe.execute()
            for name, tombstone in marked:
                self._client.eval(_DELETE_AND_MARK, 2, name, tombstone, self._mark_ms)
        except _ERRORS:
            self._count_error()
            return False
        return True

    def ttl_left(self, key: str) -> float | None:
        if self._suspects and self._suspects.holds(key):
            return 0.0
        try:
            millis = self._client.pttl(self.redis_key(key))
        except _ERRORS:
            self._count_error()
            return 0.0
        if millis == -1:  # exists, no expiry
            return None
        return max(0.0, millis / 1000) if millis >= 0 else 0.0  # -2: absent

    def touch(self, key: str, ttl_s: float | None) -> bool:
        if self._suspects and self._suspects.holds(key):
            return False
        try:
            if ttl_s is None:
                return bool(self._client.persist(self.redis_key(key))) or self.contains(key)
            return bool(self._client.pexpire(self.redis_key(key), max(1, int(ttl_s * 1000))))
        except _ERRORS:
            self._count_error()
            return False

    def contains(self, key: str) -> bool:
        if self._suspects and self._suspects.holds(key):
            return False
        try:
            return bool(self._client.exists(self.redis_key(key)))
        except _ERRORS:
            self._count_error()
            return False

    def contains_many(self, keys: list[str]) -> list[bool]:
        """Whether each of `keys` is held: pipelined EXISTS, `bulk_batch` keys per round trip
        (a warm-up planner asks about thousands at once). All False on an error, counted."""
        if self._suspects:
            self._suspects.retry()
            return [
                held and not self._suspects.holds(key, retry=False)
                for key, held in zip(keys, self._contains_many(keys), strict=True)
            ]
        return self._contains_many(keys)

    def _contains_many(self, keys: list[str]) -> list[bool]:
        held: list[bool] = []
        try:
            for start in range(0, len(keys), self._bulk_batch):
                pipe = self._client.pipeline(transaction=False)
                for key in keys[start : start + self._bulk_batch]:
                    pipe.exists(self.redis_key(key))
                held.extend(bool(n) for n in pipe.execute())
        except _ERRORS:
            self._count_error()
            return [False] * len(keys)
        return held

    def stats(self) -> TierStats:
        """Counters of this instance; items and bytes come from a SCAN of the namespace."""
        items = used = 0
        try:
            # values only: the namespace's invalidation stream lives beside them
            pattern = f"{self.namespace}:*"
            for name in self._client.scan_iter(match=pattern, count=1000, _type="string"):
                if (name if isinstance(name, str) else name.decode()).endswith(_TOMBSTONE_SUFFIX):
                    continue  # a tombstone, not a value
                items += 1
                used += int(self._client.strlen(name))
        except _ERRORS:
            self._count_error()
            items = used = -1
        return TierStats(**{**vars(self._stats), "items": items, "bytes": used})

    def check(self) -> list[str]:
        problems = []
        if self._suspects.lost_track:
            problems.append(
                f"more than {_SUSPECT_LIMIT} keys may hold older values: every read misses"
            )
        try:
            self._client.ping()
        except _ERRORS as err:
            problems.append(f"redis unreachable: {err}")
        return problems

    def close(self) -> None:
        if self._bulk_pool is not None:
            self._bulk_pool.shutdown(wait=True)
        self._client.close()

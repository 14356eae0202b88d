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
after it, from any process, even one that dies before it could clean up (`redis_tombstones.py`).
Answer keys carry their whole key as a hash tag, so the tombstone lives on the same Redis
Cluster slot. The connection (ACL, TLS, cluster) is `redis_connection.py`; the pipelined MSETs
of warm-up writes, `redis_bulk.py`.

Redis evicts on its own (`maxmemory-policy`): `pinned` entries are written without a TTL, which
keeps them under the `volatile-*` policies; under `allkeys-*` nothing can be pinned in Redis,
which is why pinned entries belong in the memory or SSD tier as well.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis

from cache_runtime.tiers.base import TierStats
from cache_runtime.tiers.redis_bulk import MsetWriter
from cache_runtime.tiers.redis_connection import REDIS_ERRORS
from cache_runtime.tiers.redis_tombstones import (
    ANSWER_KINDS,
    DELETE_AND_MARK,
    MIN_TOMBSTONE_TTL_S,
    SET_UNLESS_INVALIDATED,
    TOMBSTONE_SUFFIX,
    TRANSIT_ALLOWANCE_S,
    OwnMarks,
    PutOutcome,
    tombstone_of,
)
from cache_runtime.tiers.suspects import SuspectKeys

_SUSPECT_LIMIT = 1_000_000  # suspect keys remembered before every read misses (`SuspectKeys`)
_SUSPECT_RETRY_S = 1.0


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
        transit_allowance_s: float = TRANSIT_ALLOWANCE_S,
    ) -> None:
        """`tombstone_ttl_s`: how long an answer's delete is remembered (see the module
        docstring); `put_unless_invalidated` refuses lookups older than that.
        `transit_allowance_s`: how late a guarded put may reach Redis, and how far this host's
        clock may run ahead of Redis's (see `put_unless_invalidated`); a larger one refuses
        more answers looked up just after another process's invalidation.

        `bulk_batch` keys per MSET (and per pipeline otherwise); `put_many` spreads its
        entries over `bulk_connections` connections at once.

        Each connection pipelines its MSETs (see `MsetWriter`), which by itself overlaps this
        process's encoding with Redis's execution, so small batches keep both busy and one
        connection suffices. Measured on 2 cores against a local Redis, 100 B values, median of
        15 (keys/s): 1,000 keys x 1 connection 1,031k, x 2 980k; 2,000 x 1 1,018k, x 2 885k;
        5,000 x 2 (the previous default, before pipelining) 656k. A second connection adds
        GIL hand-offs and no overlap here; it may pay against a remote Redis (not measured).
        """
        if ":" in namespace or not namespace:
            raise ValueError("namespace must be non-empty and contain no ':'")
        if not tombstone_ttl_s >= MIN_TOMBSTONE_TTL_S:
            raise ValueError(f"tombstone_ttl_s must be at least {MIN_TOMBSTONE_TTL_S:g}")
        if not 0 < transit_allowance_s < tombstone_ttl_s:
            raise ValueError("transit_allowance_s must be positive and below tombstone_ttl_s")
        self.tombstone_ttl_s = tombstone_ttl_s
        self.transit_allowance_s = transit_allowance_s
        self._mark_ms = max(1, int(tombstone_ttl_s * 1000))
        self._own_marks = OwnMarks()  # this tier's latest deletes (`own_mark`)
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
        self._msets = MsetWriter(
            client, self.redis_key, self._count_error, bulk_batch, bulk_connections
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
        if parts[2] in ANSWER_KINDS and not self._standalone:
            return f"{self.namespace}:{parts[3]}:{{{key}}}"
        return f"{self.namespace}:{parts[3]}:{key}"

    def get(self, key: str) -> bytes | None:
        if self._suspects and self._suspects.holds(key):
            self._stats.misses += 1
            return None
        try:
            value = self._client.get(self.redis_key(key))
        except REDIS_ERRORS:
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
        looked_up_ns: int,
        own_mark: str = "",
    ) -> PutOutcome:
        """Write the answer `key` unless some process invalidated it at or after the lookup that
        `value` was computed from, which began at `looked_up_ns` (`time.monotonic_ns()` of this
        process); check and write run as one script on the server (`redis_tombstones.py`).
        "invalidated" also for a lookup older than `tombstone_ttl_s` (its tombstone may be
        gone). A failure leaves the key a suspect, as `put` does.

        The script places the lookup on the server's clock, which timed the tombstone, two ways
        and takes the earlier, `transit_allowance_s` (t) earlier still:
        - by its age: the time since the lookup when the call is sent, taken back from the
          server's clock when the script runs. No clocks of two hosts are compared, but a call
          that reaches Redis late (a busy or paused Redis, a timeout after which Redis still
          runs it, a cluster client's retry) makes the age too short;
        - by its wall time on this host. A late call changes nothing, but a host clock that
          runs ahead of Redis's makes it too late.
        So a stale answer could land only if this host's clock ran more than t ahead of Redis's
        *and* the call reached Redis more than t late; and a "stored" reply that itself came
        more than t after the call was sent is not trusted: the key is deleted again (a
        suspect if that fails too), counted as an error, and the put is "taken_back": its
        caller drops its own copies and tells the other processes, which may have read it
        meanwhile (a miss, never a stale answer).

        `own_mark`: a tombstone that does not count (`own_mark(key, looked_up_ns)`: this tier's
        own last delete of the key, complete in every tier of its cache before the lookup, on
        one clock; the caller reads it under its copy lock, right after its fences showed no
        delete of the key running). Without it the allowance would refuse the refill of an
        invalidation, and every answer looked up in the second after it, in the very process
        that invalidated. A delete since, by anyone, leaves another tombstone, which still
        refuses it.

        Raises:
            ValueError: `key` is not an answer (only answers have tombstones).
        """
        name = self.redis_key(key)
        tombstone = tombstone_of(key, name)
        if tombstone is None:
            raise ValueError(f"only answers (exact, semantic) have tombstones: {key[:80]!r}")
        with self._stats_lock:
            self._stats.puts += 1
        if self._suspects and self._suspects.holds(key):
            return "failed"  # Redis may still hold an older value: not written over
        wall = time.time()  # first: a stall before the next line only makes it earlier
        sent_ns = time.monotonic_ns()
        age_s = max(sent_ns - looked_up_ns, 0) / 1e9 + self.transit_allowance_s
        if age_s > self.tombstone_ttl_s:  # no tombstone may be left to say: refused
            return "invalidated"
        px = "0" if ttl_s is None else str(max(1, int(ttl_s * 1000)))
        oldest = int(self.tombstone_ttl_s * 1e6)
        wall_us = math.floor((wall - age_s) * 1e6)
        try:
            written = self._client.eval(
                SET_UNLESS_INVALIDATED, 2, name, tombstone,
                value, px, math.ceil(age_s * 1e6), oldest, own_mark, wall_us,
            )  # fmt: skip
        except REDIS_ERRORS:
            self._count_error()
            self._suspects.add([key])
            return "failed"
        if not written:
            return "invalidated"
        if time.monotonic_ns() - sent_ns > self.transit_allowance_s * 1e9:
            # it may have run late, its age then too short: it cannot be shown current
            self._count_error()
            self.delete(key)  # (a suspect if this fails too)
            return "taken_back"
        return "stored"

    def put_many(self, items: Iterable[tuple[str, bytes, float | None]]) -> int:
        """Bulk writes (warm-up); returns how many keys were stored.

        Entries without a TTL go as pipelined MSETs (`MsetWriter`) over `bulk_connections`
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
            stored = self._msets.write(plain) if plain else 0
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
        except REDIS_ERRORS:
            self._count_error()
            return 0
        refused = sum(1 for reply in replies if isinstance(reply, Exception))
        if refused:
            self._count_error(refused)
        return sum(1 for reply in replies if reply and not isinstance(reply, Exception))

    def _count_error(self, count: int = 1) -> None:
        with self._stats_lock:
            self._stats.errors += count

    def delete(self, key: str, *, mark: bool = True) -> bool:
        """An answer's delete leaves its tombstone (see the module docstring) unless `mark` is
        False: a copy cleared because a newer value went elsewhere is no invalidation, and its
        tombstone would refuse other processes' fresh answers."""
        name = self.redis_key(key)
        tombstone = tombstone_of(key, name) if mark else None
        try:
            if tombstone is None:
                deleted = bool(self._client.delete(name))
            else:
                count, stamp = self._client.eval(DELETE_AND_MARK, 2, name, tombstone, self._mark_ms)
                deleted = bool(count)
                if stamp:
                    self._own_marks.remember(key, stamp)
        except REDIS_ERRORS:
            self._count_error()
            self._suspects.add([key])
            return False
        self._suspects.discard(key)
        return deleted

    def own_mark(self, key: str, looked_up_ns: int) -> str:
        """The tombstone this tier's last delete of `key` left, if its cache settled that
        delete (`settle`) before `looked_up_ns` (monotonic); else "" (see
        `put_unless_invalidated`)."""
        return self._own_marks.before(key, looked_up_ns)

    def settle(self, key: str) -> None:
        """Its cache's delete of `key` is complete in every tier: lookups from now on read no
        old copy, so the tombstone of this tier's last delete of it need not refuse them."""
        self._own_marks.settle(key)

    def _delete_all(self, keys: list[str]) -> bool:
        """One pipeline of DELs (the suspects' drop; answers leave tombstones, as in `delete`);
        False, counted, if it failed. A cluster pipeline cannot run scripts: there the answers
        go one script call each (suspects are few: keys whose writes failed lately)."""
        try:
            pipe = self._client.pipeline(transaction=False)
            marked = []
            for key in keys:
                name = self.redis_key(key)
                tombstone = tombstone_of(key, name)
                if tombstone is None:
                    pipe.delete(name)
                elif self._standalone:
                    pipe.eval(DELETE_AND_MARK, 2, name, tombstone, self._mark_ms)
                else:
                    marked.append((name, tombstone))
            pipe.execute()
            for name, tombstone in marked:
                self._client.eval(DELETE_AND_MARK, 2, name, tombstone, self._mark_ms)
        except REDIS_ERRORS:
            self._count_error()
            return False
        return True

    def ttl_left(self, key: str) -> float | None:
        if self._suspects and self._suspects.holds(key):
            return 0.0
        try:
            millis = self._client.pttl(self.redis_key(key))
        except REDIS_ERRORS:
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
        except REDIS_ERRORS:
            self._count_error()
            return False

    def contains(self, key: str) -> bool:
        if self._suspects and self._suspects.holds(key):
            return False
        try:
            return bool(self._client.exists(self.redis_key(key)))
        except REDIS_ERRORS:
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
        except REDIS_ERRORS:
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
                if (name if isinstance(name, str) else name.decode()).endswith(TOMBSTONE_SUFFIX):
                    continue  # a tombstone, not a value
                items += 1
                used += int(self._client.strlen(name))
        except REDIS_ERRORS:
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
        except REDIS_ERRORS as err:
            problems.append(f"redis unreachable: {err}")
        return problems

    def close(self) -> None:
        self._msets.close()
        self._client.close()

"""The Redis tier: shared by all serving nodes; TTLs, per-tenant namespaces, pipelined bulk writes.

Redis keys are `<namespace>:<tenant>:<cache key string>` (see `redis_key`), so an ACL user of
one tenant can be limited to `~<namespace>:<tenant>:*` and one tenant's keys can be listed or
flushed alone.
Every backend failure (connection refused, timeout, server restarting) is counted and answered
as a miss or a refused put; redis-py reconnects on the next call, so the tier heals by itself.
That holds from start-up on: a Redis Cluster that no node answers for yet is built later
(`LazyRedisCluster`), so a serving process starts with a degraded cache, not a crash.

On a Redis Cluster an answer (exact, semantic) gets its whole key as a hash tag, so its
generation counter (`generations.RedisGenerations`) shares its slot: a lookup's counters and value
go to one node. The connection (ACL, TLS, cluster) is `redis_connection.py`; the pipelined MSETs
of warm-up writes, `redis_bulk.py`.

Redis evicts on its own (`maxmemory-policy`): `pinned` entries are written without a TTL, which
keeps them under the `volatile-*` policies; under `allkeys-*` nothing can be pinned in Redis,
which is why pinned entries belong in the memory or SSD tier as well.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis

from cache_runtime.tiers.base import TierStats
from cache_runtime.tiers.redis_bulk import MsetWriter
from cache_runtime.tiers.redis_connection import REDIS_ERRORS

if TYPE_CHECKING:
    from cache_runtime.generations import RedisGenerations

_ANSWER_KINDS = ("exact", "semantic")  # tagged by their own key on a cluster (`redis_key`)
MGET_KEYS = 32  # keys per MGET of a batched read (`_mget`): 32 KV pages of GPT-2 small are 38 MB


class RedisTier:
    """A tier in Redis under `namespace`; `client` is a redis-py client (standalone or cluster:
    a `RedisCluster` or a `LazyRedisCluster`)."""

    shared = True  # every process sees the same entries

    def __init__(
        self,
        client: Any,
        namespace: str = "preheat",
        name: str = "redis",
        bulk_batch: int = 1000,
        bulk_connections: int = 1,
    ) -> None:
        """`bulk_batch` keys per MSET (and per pipeline otherwise); `put_many` spreads its
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
        self.name = name
        self.namespace = namespace
        self._client = client
        # Standalone by type, not by a `connection_pool` attribute: asking a LazyRedisCluster
        # for one would try to build the cluster (and raise while it is down)
        self._standalone = isinstance(client, redis.Redis)
        self._stats = TierStats()
        self._stats_lock = threading.Lock()
        self._bulk_batch = bulk_batch
        self._msets = MsetWriter(
            client, self.redis_key, self._count_error, bulk_batch, bulk_connections
        )

    def redis_key(self, key: str) -> str:
        """`<namespace>:<tenant>:<key>`; KV pages get a `{<chain root>}` hash tag so that every
        page of one prefix chain lives on one Redis Cluster slot. On a cluster, answers (exact,
        semantic) get the tag `{<key>}`, so that their generation counter shares their slot;
        the key's fields are percent-encoded, so no brace of its own can end the tag early.
        Standalone, they keep their untagged names (no slots to share).

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

    def generations(self) -> RedisGenerations:
        """Answer generations in this Redis, shared by every process that uses it."""
        from cache_runtime.generations import RedisGenerations  # (it imports the tiers)

        return RedisGenerations(self._client, self.namespace)

    def pipelines_with(self, generations: object) -> bool:
        """Whether a value of this tier can be read in `generations`' round trip (same client)."""
        return getattr(generations, "client", None) is self._client

    def get(self, key: str) -> bytes | None:
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

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Values of `keys` in one round trip: an MGET standalone; on a Cluster, one MGET per
        slot (the pages of one prefix chain share theirs: `redis_key`). All None on an error,
        counted."""
        names = [self.redis_key(key) for key in keys]
        try:
            values = self._mget(names) if self._standalone else self._client.mget_nonatomic(names)
        except REDIS_ERRORS:
            self._count_error()
            self._stats.misses += len(keys)
            return [None] * len(keys)
        hits = sum(value is not None for value in values)
        self._stats.hits += hits
        self._stats.misses += len(keys) - hits
        return list(values)

    def _mget(self, names: list[str]) -> list[bytes | None]:
        """One round trip of MGETs of at most `MGET_KEYS` keys each, pipelined: Redis builds a
        reply whole before its first byte leaves, so one MGET of a long chain's pages (511
        pages of 1.2 MB: 600 MB) outlasts the socket timeout and reads as a failure, while
        slices start streaming after the first one's few MB."""
        if len(names) <= MGET_KEYS:
            return self._client.mget(names)
        pipe = self._client.pipeline(transaction=False)
        for start in range(0, len(names), MGET_KEYS):
            pipe.mget(names[start : start + MGET_KEYS])
        return [value for values in pipe.execute() for value in values]

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
        return self.put_many([(key, value, ttl_s)]) == 1

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

    def delete(self, key: str) -> bool:
        try:
            return bool(self._client.delete(self.redis_key(key)))
        except REDIS_ERRORS:
            self._count_error()
            return False

    def ttl_left(self, key: str) -> float | None:
        try:
            millis = self._client.pttl(self.redis_key(key))
        except REDIS_ERRORS:
            self._count_error()
            return 0.0
        if millis == -1:  # exists, no expiry
            return None
        return max(0.0, millis / 1000) if millis >= 0 else 0.0  # -2: absent

    def ttl_left_many(self, keys: list[str]) -> list[float | None]:
        """`ttl_left` of each key in one pipelined round trip (0.0 for all on an error)."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(self.redis_key(key))
            found = pipe.execute()
        except REDIS_ERRORS:
            self._count_error()
            return [0.0] * len(keys)
        return [None if ms == -1 else max(0.0, ms / 1000) if ms >= 0 else 0.0 for ms in found]

    def touch(self, key: str, ttl_s: float | None) -> bool:
        try:
            if ttl_s is None:
                return bool(self._client.persist(self.redis_key(key))) or self.contains(key)
            return bool(self._client.pexpire(self.redis_key(key), max(1, int(ttl_s * 1000))))
        except REDIS_ERRORS:
            self._count_error()
            return False

    def contains(self, key: str) -> bool:
        try:
            return bool(self._client.exists(self.redis_key(key)))
        except REDIS_ERRORS:
            self._count_error()
            return False

    def contains_many(self, keys: list[str]) -> list[bool]:
        """Whether each of `keys` is held: pipelined EXISTS, `bulk_batch` keys per round trip
        (a warm-up planner asks about thousands at once). All False on an error, counted."""
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
            # values only: generation counters live beside them
            pattern = f"{self.namespace}:*"
            for name in self._client.scan_iter(match=pattern, count=1000, _type="string"):
                text = name if isinstance(name, str) else name.decode()
                if text.endswith((":gen", ":gen-tenant")) or ":gen-template:" in text:
                    continue  # a counter, not a value
                items += 1
                used += int(self._client.strlen(name))
        except REDIS_ERRORS:
            self._count_error()
            items = used = -1
        return TierStats(**{**vars(self._stats), "items": items, "bytes": used})

    def check(self) -> list[str]:
        problems = []
        try:
            self._client.ping()
        except REDIS_ERRORS as err:
            problems.append(f"redis unreachable: {err}")
        return problems

    def close(self) -> None:
        self._msets.close()
        self._client.close()

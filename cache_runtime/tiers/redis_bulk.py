"""Pipelined MSETs: how the Redis tier writes a warm-up's TTL-less entries to a standalone Redis
at the rate of `redis-benchmark -P 16` (`RedisTier.put_many`; `bench runtime` measures both).

Apart from `redis_tier.py` because it speaks the wire protocol itself: its commands are packed
here rather than by redis-py, whose per-command packing costs more than Redis takes to run the
command (measured 90k SETs/s through a redis-py pipeline, 575k keys/s with one MSET per round
trip, over 1M keys/s pipelined as below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from cache_runtime.tiers.redis_connection import REDIS_ERRORS

MSET_MAX_BYTES = 8 << 20  # of values per MSET command (see `MsetWriter.commands`)
_INLINE_VALUE_BYTES = 64 << 10  # larger values are not copied into their entry


class MsetWriter:
    """Writes key -> value dicts as MSETs of up to `batch` keys, pipelined on each of
    `connections` pooled connections of a standalone redis-py `client`.

    `redis_key` names a cache key in Redis (`RedisTier.redis_key`); `count_error(n)` is told of
    each failure (a refused MSET, a lost connection), which is never raised.
    """

    def __init__(
        self,
        client: Any,
        redis_key: Callable[[str], str],
        count_error: Callable[[int], None],
        batch: int = 1000,
        connections: int = 1,
    ) -> None:
        self._client = client
        self._redis_key = redis_key
        self._count_error = count_error
        self._batch = batch
        self._connections = connections
        self._pool = (
            ThreadPoolExecutor(connections, thread_name_prefix="preheat-redis-bulk")
            if connections > 1
            else None
        )

    def write(self, values: dict[str, bytes]) -> int:
        """`values` in contiguous slices, one per connection, each pipelined by `_mset`;
        returns how many keys were stored.

        A slice per connection rather than a batch per task: each connection then keeps its
        MSETs in flight back to back, and a put of one batch or less never changes thread.
        One key per dict entry, so no two slices write the same key.
        """
        slices = 1 if self._pool is None else self._connections
        slices = min(slices, -(-len(values) // self._batch))
        if slices < 2:
            return self._mset(values.items())
        pairs = list(values.items())
        size = -(-len(pairs) // slices)
        parts = [pairs[low : low + size] for low in range(0, len(pairs), size)]
        assert self._pool is not None
        return sum(self._pool.map(self._mset, parts))

    def _mset(self, pairs: Iterable[tuple[str, bytes]]) -> int:
        """MSETs on one pooled connection, pipelined: each is sent as soon as it is encoded and
        the replies are read at the end, so encoding the next batch (which holds the GIL)
        overlaps Redis executing the previous one. Returns how many keys were stored.

        Rejected: one MSET per round trip (the client idles while Redis executes, and Redis
        while the client encodes).
        """
        pool = self._client.connection_pool
        try:
            connection = pool.get_connection()
        except REDIS_ERRORS:
            self._count_error(1)
            return 0
        sent: list[int] = []
        stored = refused = 0
        try:
            for count, command in self.commands(pairs):
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
        except REDIS_ERRORS:
            connection.disconnect()  # replies outstanding: never reuse this connection
            self._count_error(1)
            return stored
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        if refused:
            self._count_error(1)
        return stored

    def commands(self, pairs: Iterable[tuple[str, bytes]]) -> Iterator[tuple[int, bytes]]:
        """(key count, packed MSET) for each `batch` keys, or fewer where the command would pass
        `MSET_MAX_BYTES` of values (KV pages are large: one command of `batch` pages would hold
        Redis's event loop, and this process's memory, too long).

        One `%`-format per entry and one join per command: measured the fastest pure-Python
        packing (0.38 us per 100 B entry; a flat list of header/value pieces joined with
        CRLF took 0.51 us). A value over `_INLINE_VALUE_BYTES` is not formatted into its
        entry, so the join is its only copy.
        """
        redis_key, batch_keys = self._redis_key, self._batch
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
            if count == batch_keys or size >= MSET_MAX_BYTES:
                parts[0] = b"*%d\r\n$4\r\nMSET\r\n" % (2 * count + 1)
                yield count, b"".join(parts)
                parts, count, size = [b""], 0, 0
        if count:
            parts[0] = b"*%d\r\n$4\r\nMSET\r\n" % (2 * count + 1)
            yield count, b"".join(parts)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

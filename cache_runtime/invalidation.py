"""Invalidation across processes: a delete in one cache process reaches the tiers every other
process holds on its own (memory, SSD), over a Redis stream they all read.

Without it, `/admin/invalidate` on one gateway replica would drop the answer from that replica
and from Redis, while every other replica kept serving the old one from its memory tier until
the TTL ran out.

- **A stream, not pub/sub.** Pub/sub delivers at most once: a reader disconnected for a second
  misses what was published meanwhile, and would serve the deleted value until its TTL. A
  stream keeps its entries for `retention_s` (trimmed by age, `XADD ... MINID`, Redis 6.2+),
  and each reader resumes after the last entry it applied.
- **A reader that cannot have applied everything says so.** Entries newer than a reader's last
  read are trimmed only once that read is older than the retention; so a reader whose last
  successful read is older than 90% of it (10% for clock skew between processes) reports a
  gap, and the cache then drops the answers its own tiers hold (see `HybridCache`). The
  position is kept in `position_path` (beside the SSD tier's files) so that a restarted process
  resumes where the node's processes left off rather than dropping the SSD's answers.
- **Health.** `healthy()` is False until the first read and when the last successful read
  began more than `stale_after_s` ago: the cache then answers no response lookup from its own
  tiers, since another process may have deleted the key meanwhile. KV pages are keyed by their
  tokens and the model's weights and never go stale; they are served regardless.
- **A publish that fails is retried** by the reader until it gets through (`pending()`).
  Meanwhile other processes may serve the value: a Redis that this process cannot reach
  delays its invalidations, it cannot lose them (unless the process exits first).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

_BATCH = 1000  # stream entries per read
_SKEW_SHARE = 0.1  # of the retention, allowed for clock skew between processes
# what an unreachable standalone Redis or Redis Cluster raises (as the Redis tier catches)
_ERRORS = (RedisError, OSError, RedisClusterException)


class InvalidationFeed:
    """One process's end of the shared stream `<namespace>:invalidations`. `client` is a
    redis-py client (standalone or cluster) with a socket timeout above `block_ms`, of the
    feed's own: `close` closes it."""

    def __init__(
        self,
        client: Any,
        namespace: str = "preheat",
        retention_s: float = 3600.0,
        stale_after_s: float = 5.0,
        block_ms: int = 500,
        position_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: wall time in seconds, the same in every process (stream ids are too)."""
        if retention_s <= 0 or stale_after_s <= 0 or block_ms <= 0:
            raise ValueError("retention_s, stale_after_s and block_ms must be positive")
        if stale_after_s * 1000 <= block_ms:
            raise ValueError("stale_after_s must be longer than one blocking read (block_ms)")
        self.stream = f"{namespace}:invalidations"
        self.retention_s = retention_s
        self.stale_after_s = stale_after_s
        self.block_ms = block_ms
        self.origin = uuid.uuid4().hex  # this process's entries: not applied again on reading
        self._client = client
        self._clock = clock
        self._position_path = position_path
        self._last_id: str | None = None  # the last entry applied (None: not started)
        self._last_read: float | None = None  # wall time the last successful read began
        self._gap = False  # deletions may have been missed, and the answers are not dropped yet
        self._pending: list[str] = []  # keys whose publish failed, oldest first
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved_at = 0.0

    # -- publishing --------------------------------------------------------------------------

    def publish(self, keys: list[str]) -> bool:
        """Tell the other processes these keys were deleted; False if Redis did not take them
        now (they are retried by the reader)."""
        with self._lock:
            self._pending.extend(keys)
        return self._flush()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _flush(self) -> bool:
        with self._lock:
            keys, self._pending = self._pending, []
        if not keys:
            return True
        oldest_kept = f"{int((self._clock() - self.retention_s) * 1000)}-0"
        try:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.xadd(
                    self.stream, {"key": key, "origin": self.origin},
                    minid=oldest_kept, approximate=True,
                )  # fmt: skip
            pipe.execute()
        except _ERRORS:
            with self._lock:
                self._pending[:0] = keys  # before any published meanwhile: order kept
            return False
        return True

    # -- reading -----------------------------------------------------------------------------

    def healthy(self) -> bool:
        last = self._last_read
        return last is not None and self._clock() - last <= self.stale_after_s

    def poll(
        self,
        apply: Callable[[list[str]], None],
        drop_answers: Callable[[], bool],
        block: bool = True,
    ) -> bool:
        """One blocking read: `apply(keys)` the other processes' deletions since the last one,
        after `drop_answers()` if some may have been missed (see the module docstring; it returns
        False if it could not drop them all). Also retries failed publishes. False if Redis or
        `drop_answers` failed: nothing was applied, and the feed stays as it was."""
        started = self._clock()
        try:
            if self._last_id is None:
                self._last_id, gap = self._start_position(started)
                self._gap = self._gap or gap
            elif self._last_read is not None and started - self._last_read > self._safe_age():
                self._gap = True
            reply = self._client.xread(
                {self.stream: self._last_id}, count=_BATCH, block=self.block_ms if block else None
            )
        except _ERRORS:
            return False
        if self._gap:
            if not drop_answers():
                return False  # still unsure: stays unhealthy, and tries again
            self._gap = False
        last_id, keys = self._last_id, []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last_id = _text(entry_id)
                if _text(fields.get(b"origin", b"")) != self.origin:
                    keys.append(_text(fields[b"key"]))
        if keys:
            apply(keys)
        self._last_id, self._last_read = last_id, started
        self._save_position()
        self._flush()
        return True

    def start(self, apply: Callable[[list[str]], None], drop_answers: Callable[[], bool]) -> None:
        """Poll in a daemon thread until `close`; after a failed read, wait before the next
        (0.1 s, doubling to 2 s) so that a Redis outage costs no busy loop. The first read is
        made here, without blocking: a cache whose Redis answers is healthy once built."""
        self.poll(apply, drop_answers, block=False)

        def run() -> None:
            backoff = 0.1
            while not self._stop.is_set():
                if self.poll(apply, drop_answers):
                    backoff = 0.1
                elif self._stop.wait(backoff):
                    return
                else:
                    backoff = min(backoff * 2, 2.0)

        self._thread = threading.Thread(target=run, name="preheat-invalidations", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop reading and close the client (the feed owns it, as the Redis tier owns its)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.block_ms / 1000 + 5)
        self._client.close()

    # -- position ----------------------------------------------------------------------------

    def _safe_age(self) -> float:
        return self.retention_s * (1 - _SKEW_SHARE)

    def _start_position(self, now: float) -> tuple[str, bool]:
        """(where to read from, whether entries may have been missed): the saved position when
        it is recent enough, else the stream's newest entry, with a gap if anything could hold
        answers from before (a position file that is too old, or none at all)."""
        saved = self._load_position()
        if saved is not None and now - saved[1] <= self._safe_age():
            return saved[0], False
        newest = self._client.xrevrange(self.stream, count=1)
        start = _text(newest[0][0]) if newest else "0-0"
        return start, self._position_path is not None

    def _load_position(self) -> tuple[str, float] | None:
        if self._position_path is None:
            return None
        try:
            saved = json.loads(self._position_path.read_text())
            return str(saved["last_id"]), float(saved["read_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet, or unreadable: treated as too old

    def _save_position(self) -> None:
        """At most once a second; atomically (write aside, then rename), since the processes of
        a node share the file. Any of them may write it: each applies every entry to the tiers
        the file stands for."""
        if self._position_path is None or self._last_read is None:
            return
        if self._last_read - self._saved_at < 1.0:
            return
        self._saved_at = self._last_read
        body = json.dumps({"last_id": self._last_id, "read_at": self._last_read})
        aside = self._position_path.with_name(f"{self._position_path.name}.{os.getpid()}.tmp")
        try:
            aside.write_text(body)
            os.replace(aside, self._position_path)
        except OSError:
            pass  # the next restart then drops the answers it cannot vouch for: safe


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

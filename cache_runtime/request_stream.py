"""Log every served request to a Redis Stream without ever slowing or failing the request.

`log_request` only puts a record on an in-process queue. A background thread sends queued records
to Redis in pipelined batches (XADD with an approximate MAXLEN cap, so a stalled consumer cannot
exhaust Redis memory). When Redis is down the thread appends the batch to a local spool file in
the generic JSONL log format instead, and stops trying Redis for a back-off period; the spool is
ingested later with `preheat ingest`, and since every record carries its request id, records
that reach the lake twice are stored once. Only when the queue itself is full (Redis stalled and
the spool unwritable) is a record dropped, and that is counted.

Rejected alternatives: calling XADD on the request path (a Redis stall becomes a latency
incident); an unbounded queue (a long outage becomes an out-of-memory crash).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

STREAM_FIELD = "r"  # each stream entry holds one JSON-encoded record under this field


@dataclass
class ProducerStats:
    """Counters since start; `enqueued == sent + spooled + dropped + queued` at any moment."""

    enqueued: int = 0
    sent: int = 0
    spooled: int = 0
    dropped: int = 0
    redis_errors: int = 0


class RequestLogProducer:
    """Background producer of request-log records to a Redis Stream.

    Args:
        client: a redis-py client; give it short socket timeouts, the thread waits on them.
        stream: stream key.
        maxlen: approximate cap on the stream length.
        spool_dir: where batches go while Redis is unreachable (None: they are dropped).
        queue_size: records held in memory before `log_request` starts dropping.
        batch_size: records per pipelined round trip.
        backoff_s: how long to stop trying Redis after a failure.
        clock: seconds since the epoch; injectable so tests control timestamps.
    """

    def __init__(
        self,
        client: redis.Redis,
        stream: str = "preheat:requests",
        maxlen: int = 1_000_000,
        spool_dir: Path | None = None,
        queue_size: int = 100_000,
        batch_size: int = 500,
        backoff_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._stream = stream
        self._maxlen = maxlen
        self._spool_dir = spool_dir
        self._batch_size = batch_size
        self._backoff_s = backoff_s
        self._clock = clock
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=queue_size)
        self._redis_down_until = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.stats = ProducerStats()
        self._thread = threading.Thread(target=self._run, name="preheat-log-producer", daemon=True)
        self._thread.start()

    def log_request(
        self,
        *,
        tenant: str,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        session_id: str | None = None,
        prompt: str | None = None,
        prefix_hashes: Sequence[int] | None = None,
        template_id: str | None = None,
        route: str | None = None,
        latency_ms: float | None = None,
        priority: int = 5,
        timestamp: float | None = None,
    ) -> bool:
        """Queue one request record; never blocks and never raises. Returns False if it had to
        be dropped (a value that cannot be serialised, or a full queue)."""
        with self._lock:
            self.stats.enqueued += 1
        try:
            record: dict[str, Any] = {
                "timestamp": self._clock() if timestamp is None else float(timestamp),
                "tenant": tenant,
                "request_id": request_id,
                "session_id": session_id or request_id,
                "prompt": prompt,
                "prompt_tokens": int(prompt_tokens),
                "output_tokens": int(output_tokens),
                # no full block means no hashes: null, as the contract wants, never []
                "prefix_hashes": [int(h) for h in ([] if prefix_hashes is None else prefix_hashes)]
                or None,
                "template_id": template_id,
                "route": route,
                "latency_ms": None if latency_ms is None else float(latency_ms),
                "priority": int(priority),
            }
            payload = orjson.dumps({k: v for k, v in record.items() if v is not None})
        except (TypeError, ValueError, OverflowError):  # e.g. a hash >= 2**64, a non-numeric count
            with self._lock:
                self.stats.dropped += 1
            return False
        try:
            self._queue.put_nowait(payload)
            return True
        except queue.Full:
            with self._lock:
                self.stats.dropped += 1
            return False

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued record was sent or spooled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)  # polling the queue's counter; the worker does the work
        return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush, then stop the background thread."""
        self.flush(timeout_s)
        self._stop.set()
        self._thread.join(timeout_s)

    # -- background thread -----------------------------------------------------------------

    def _take_batch(self) -> list[bytes]:
        try:
            batch = [self._queue.get(timeout=0.05)]
        except queue.Empty:
            return []
        while len(batch) < self._batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            batch = self._take_batch()
            if not batch:
                continue
            try:
                self._deliver(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _deliver(self, batch: list[bytes]) -> None:
        if time.monotonic() >= self._redis_down_until:
            try:
                pipe = self._client.pipeline(transaction=False)
                for payload in batch:
                    pipe.xadd(
                        self._stream, {STREAM_FIELD: payload}, maxlen=self._maxlen, approximate=True
                    )
                pipe.execute()
                with self._lock:
                    self.stats.sent += len(batch)
                return
            except redis.RedisError:
                self._redis_down_until = time.monotonic() + self._backoff_s
                with self._lock:
                    self.stats.redis_errors += 1
        self._spool(batch)

    def _spool(self, batch: list[bytes]) -> None:
        if self._spool_dir is None:
            with self._lock:
                self.stats.dropped += len(batch)
            return
        try:
            self._spool_dir.mkdir(parents=True, exist_ok=True)
            path = self._spool_dir / f"requests-{os.getpid()}.jsonl"
            with open(path, "ab") as spool:
                spool.write(b"\n".join(batch) + b"\n")
                spool.flush()
                os.fsync(spool.fileno())
            with self._lock:
                self.stats.spooled += len(batch)
        except OSError:
            with self._lock:
                self.stats.dropped += len(batch)

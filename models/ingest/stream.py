"""Live ingestion: a Redis Streams consumer-group reader that writes request logs to the lake.

Delivery is at-least-once from Redis and exactly-once into the lake: an entry is acknowledged
(XACK) only after its batch is committed to the lake, and the lake drops rows whose request id it
already holds. A consumer that dies mid-batch leaves its entries pending; any consumer in the
group claims them after `min_idle_ms` (XAUTOCLAIM) and re-processes them, which adds only the
rows that had not been committed yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from cache_runtime.request_stream import STREAM_FIELD
from data_contracts.lake import Lake
from models.ingest.formats import SourceContext
from models.ingest.formats_generic import Generic
from models.ingest.pipeline import process_chunk
from models.ingest.readers import Record, RowError

DEFAULT_GROUP = "preheat-ingest"


@dataclass
class StreamBatchReport:
    """One batch: entries read (new + claimed), accepted, quarantined, newly written, acked."""

    read: int = 0
    claimed: int = 0
    accepted: int = 0
    quarantined: int = 0
    written: int = 0
    acked: int = 0


def entry_row_number(entry_id: str) -> int:
    """A stream entry id `<ms>-<seq>` as one integer, ordered like the ids, for the quarantine."""
    ms, seq = entry_id.split("-")
    return int(ms) * 2**20 + int(seq)


class StreamConsumer:
    """One member of a consumer group; call `run_once` in a loop, or `drain`."""

    def __init__(
        self,
        client: redis.Redis,
        lake: Lake,
        stream: str,
        consumer: str,
        group: str = DEFAULT_GROUP,
        batch_size: int = 1000,
        min_idle_ms: int = 30_000,
        after_write: Callable[[list[str]], None] | None = None,
    ) -> None:
        """`after_write` runs between the lake commit and XACK; tests use it to crash there."""
        self.client = client
        self.lake = lake
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.batch_size = batch_size
        self.min_idle_ms = min_idle_ms
        self._after_write = after_write
        self._format = Generic("jsonl")
        self._ctx = SourceContext(source=f"redis-stream:{stream}")
        self._read_own_pending = True

    def ensure_group(self) -> None:
        """Create the group at the start of the stream (and the stream) unless it exists."""
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def _fetch(self, block_ms: int) -> tuple[list[tuple[str, dict]], int]:
        """Entries to process: our own pending first (after a restart), then stale ones of dead
        consumers, then new ones."""
        if self._read_own_pending:
            own = self.client.xreadgroup(
                self.group, self.consumer, {self.stream: "0"}, count=self.batch_size
            )
            entries = own[0][1] if own else []
            if entries:
                return entries, 0
            self._read_own_pending = False
        claimed = self.client.xautoclaim(
            self.stream, self.group, self.consumer, self.min_idle_ms, "0-0", count=self.batch_size
        )[1]
        claimed = [e for e in claimed if e[1] is not None]  # trimmed away by MAXLEN: nothing left
        if claimed:
            return claimed, len(claimed)
        new = self.client.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=self.batch_size, block=block_ms
        )
        return (new[0][1] if new else []), 0

    def run_once(self, block_ms: int = 1000) -> StreamBatchReport:
        """Process one batch; returns an empty report when there was nothing to do."""
        entries, claimed = self._fetch(block_ms)
        report = StreamBatchReport(read=len(entries), claimed=claimed)
        if not entries:
            return report
        records: list[Record] = []
        for entry_id, fields in entries:
            entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            payload = (fields or {}).get(STREAM_FIELD.encode(), (fields or {}).get(STREAM_FIELD))
            number = entry_row_number(entry)
            if not isinstance(payload, bytes):
                records.append((number, RowError(f"entry {entry}: no '{STREAM_FIELD}' field"), b""))
            else:
                records.append((number, payload, payload))
        result = process_chunk(self._format, records, self._ctx)
        appended = self.lake.append("requests", result.good)
        self.lake.append("quarantine", result.quarantine)
        ids = [e[0] for e in entries]
        if self._after_write is not None:
            self._after_write([i.decode() if isinstance(i, bytes) else i for i in ids])
        report.acked = int(self.client.xack(self.stream, self.group, *ids))
        report.accepted = len(result.good) + result.repeated
        report.quarantined = len(result.quarantine)
        report.written = appended.written
        return report

    def drain(self, block_ms: int = 200, max_batches: int | None = None) -> StreamBatchReport:
        """Process batches until one comes back empty (or `max_batches`); return the totals."""
        total = StreamBatchReport()
        batches = 0
        while max_batches is None or batches < max_batches:
            report = self.run_once(block_ms)
            batches += 1
            if report.read == 0:
                break
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(report, name))
        return total


def drain_into_lake(
    redis_url: str,
    lake: Lake,
    stream: str,
    consumer: str,
    group: str = DEFAULT_GROUP,
    block_ms: int = 200,
    max_batches: int | None = None,
    min_idle_ms: int = 30_000,
) -> StreamBatchReport:
    """`StreamConsumer.drain` on a client of its own, closed after: the group created if
    missing, batches until the stream is empty (or `max_batches`); returns the totals."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    try:
        reader = StreamConsumer(client, lake, stream, consumer, group, min_idle_ms=min_idle_ms)
        reader.ensure_group()
        return reader.drain(block_ms=block_ms, max_batches=max_batches)
    finally:
        client.close()

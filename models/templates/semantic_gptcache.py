"""GPTCache, the peer semantic cache, run offline in this process for `preheat bench semantic`.

Set up as its documentation's "similar cache": a SQLite scalar store (in memory) and a faiss
vector store (`IDMap,Flat`, L2), `SearchDistanceEvaluation()` with its defaults (max_distance=4.0,
positive=False), and our MiniLM embedder as its custom embedding function, on the raw prompt
(GPTCache does not normalise). Nothing is downloaded; faiss-cpu must be installed before gptcache
is imported, or gptcache pip-installs it at run time (`gptcache.utils.import_faiss`).

Its threshold is not a cosine. faiss returns the squared L2 distance d = |a - b|^2 = 2 - 2cos for
unit vectors; the evaluation scores rank = max_distance - d = 2 + 2cos on (0, 4); the adapter hits
when rank >= 4 * similarity_threshold. So similarity_threshold t means cosine >= 2t - 1, and
cosine c needs t = (1 + c) / 2 (`similarity_threshold_for_cosine`): GPTCache's "0.8" is cosine
0.6. A pair's GPTCache score (`score`) is rank / 4, read from its own hit callback, so calibrating
on it gives a `similarity_threshold` directly.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from models.templates.embeddings import DIMENSIONS
from models.templates.semantic import Embeds

MAX_DISTANCE = 4.0  # SearchDistanceEvaluation's default


def similarity_threshold_for_cosine(cosine: float) -> float:
    """GPTCache's `similarity_threshold` that hits exactly when cosine >= `cosine`."""
    return (1.0 + cosine) / 2.0


def cosine_for_similarity_threshold(threshold: float) -> float:
    return 2.0 * threshold - 1.0


class _Closed:
    def close(self) -> None:
        """GPTCache registers an atexit close of its data manager: after ours, a no-op."""


class GPTCachePeer:
    """One GPTCache instance answering pair questions: store `a`, look up `b`, forget `a`."""

    def __init__(self, embedder: Embeds, dimension: int = DIMENSIONS) -> None:
        import faiss  # first: else gptcache tries to pip-install it
        from gptcache import Cache, Config
        from gptcache.manager import CacheBase, VectorBase, get_data_manager
        from gptcache.processor.pre import get_prompt
        from gptcache.similarity_evaluation import SearchDistanceEvaluation

        # One pair at a time: OpenMP threads only add start-up cost (6 ms a search on 2 cores).
        faiss.omp_set_num_threads(1)
        self._dir = tempfile.TemporaryDirectory(prefix="preheat-gptcache-")
        self.embedder = embedder
        with warnings.catch_warnings():  # its SQLAlchemy models use 1.x APIs
            warnings.simplefilter("ignore", DeprecationWarning)
            # SQLite in memory: the scalar store only holds the pair's answer; a file would cost
            # an fsync per lookup (GPTCache commits a hit count on every get) and decide nothing.
            self.manager: Any = get_data_manager(
                CacheBase("sqlite", sql_url="sqlite:///:memory:"),
                VectorBase(
                    "faiss", dimension=dimension, index_path=f"{self._dir.name}/faiss.index"
                ),
            )
        self.cache: Any = Cache()
        self.cache.init(
            pre_embedding_func=get_prompt,
            embedding_func=self._embed,
            data_manager=self.manager,
            similarity_evaluation=SearchDistanceEvaluation(),
            config=Config(similarity_threshold=0.8),
        )
        self._stored = 0

    def _embed(self, text: str, **_: Any) -> np.ndarray:
        return self.embedder.embed([text])[0]

    def _put(self, prompt: str) -> None:
        from gptcache.adapter.api import put

        put(prompt, "cached answer", cache_obj=self.cache)

    def _get(self, prompt: str, threshold: float, callback: Any = None) -> bool:
        from gptcache.adapter.api import get

        self.cache.config.similarity_threshold = threshold
        extra = {"hit_callback": callback} if callback is not None else {}
        return get(prompt, cache_obj=self.cache, **extra) is not None

    def _forget(self) -> None:
        ids = self.manager.s.get_ids(deleted=False)
        if ids:
            self.manager.v.delete(ids)
            self.manager.s.mark_deleted(ids)
        self._stored += 1
        if self._stored % 500 == 0:
            self.manager.s.clear_deleted_data()

    def score(self, a: str, b: str) -> float:
        """GPTCache's own similarity of `b` to a stored `a`, on its threshold's scale [0, 1]."""
        scores: list[float] = []
        self._put(a)
        try:
            self._get(b, 0.0, lambda hits: scores.extend(s for _, s in hits))
        finally:
            self._forget()
        return max(scores) if scores else 0.0

    def hits(self, a: str, b: str, thresholds: Sequence[float]) -> list[bool]:
        """Whether GPTCache serves `a`'s answer for `b`, at each `similarity_threshold`."""
        self._put(a)
        try:
            return [self._get(b, t) for t in thresholds]
        finally:
            self._forget()

    def close(self) -> None:
        self.manager.close()
        self.cache.data_manager = _Closed()
        self._dir.cleanup()

    def __enter__(self) -> GPTCachePeer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def gptcache_available() -> str | None:
    """None when gptcache and faiss import; else why not (the bench then reports it)."""
    try:
        import faiss  # noqa: F401
        import gptcache  # noqa: F401
    except ImportError as err:
        return f"gptcache unavailable: {err}"
    return None


__all__ = [
    "MAX_DISTANCE",
    "GPTCachePeer",
    "cosine_for_similarity_threshold",
    "gptcache_available",
    "similarity_threshold_for_cosine",
]

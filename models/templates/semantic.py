"""Semantic keys: SimHash of a prompt's embedding, bucketed per tenant and template (issue 6).

A semantic key says *where to look* for a cached answer to a similar prompt, never that one was
found: a hit is decided by verification (`semantic_cache.SemanticCache`): cosine similarity to the
stored prompt at or above a calibrated threshold, and equal guarded entities (`guards.py`).

- `normalise(text)`: what a key is robust to by construction: Unicode NFKC, case, whitespace and
  punctuation (kept inside numbers, "1,000.50" and "2024-03-01", where it carries meaning;
  apostrophes dropped, "don't" == "dont"). Two prompts equal after it get the same embedding and
  so the same key; anything else (a typo, a synonym) is up to the embedding.
- `simhash64(vector)`: random-hyperplane SimHash: bit i (most significant first) is the sign of
  the projection on plane i. The 64 planes are +-1 vectors drawn from BLAKE2b of a fixed seed
  (`SIMHASH_SEED`), not from a NumPy generator (whose streams may change between versions), so a
  key computed today matches one computed by another process, machine or NumPy tomorrow.
  (+-1 planes are Achlioptas' projections: in 384 dimensions they behave like Gaussian ones.)
- Buckets, decided by measurement (`benchmarks/semantic.py`, development pairs from the shipped
  prompts, seed 0): the full 64-bit SimHash is equal for 0 of 272 one-character-typo pairs
  (median cosine 0.84) and for 25% of all 1,600 positives (those equal after `normalise`): far
  too brittle as a bucket. So the bucket is the SimHash's leading `BUCKET_BITS` bits and a lookup
  probes `PROBES` buckets in query-directed order (flip the bits whose projections are nearest
  zero first). Of the 1,203 positives whose cosine clears the calibrated threshold (0.89), 69%
  share the 6-bit bucket and the 16 probes find 99.6% (all 81 typos among them); at 8 bits, 16
  probes find 97.8% and 32 find 99.3%; at 12 bits, 32 find 94.8%. A Hamming ball of radius 2
  (22 probes at 6 bits) found 98.0% where query-directed probes found 99.1% with 16.

Changing the seed, the plane construction, `normalise` or `BUCKET_BITS` changes every key: bump
`cache_runtime.keys.KEY_FORMAT_VERSION` with it (old entries then simply miss).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import unicodedata
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cache_runtime.keys import SemanticKey
from models.templates.embeddings import DIMENSIONS

if TYPE_CHECKING:
    from models.templates.semantic_cache import SemanticCache, SemanticHit
    from models.templates.semantic_calibration import Calibration, calibrate

__all__ = [
    "BUCKET_BITS", "PROBES", "SIMHASH_SEED", "Calibration", "SemanticCache", "SemanticHit",
    "bucket_of", "calibrate", "normalise", "probe_buckets", "semantic_key", "simhash64",
]  # fmt: skip

SIMHASH_SEED = b"preheat-simhash-v1"
SIMHASH_BITS = 64
# Leading SimHash bits that name a bucket, and the buckets a lookup probes (module docstring;
# `benchmarks/semantic.py` prints the recall table for other widths and probe counts).
BUCKET_BITS = 6
PROBES = 16

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201b": "'", "\u02bc": "'", "`": "'"})
_INNER_NUMBER_PUNCT = re.compile(r"(?<=\d)[.,:/-](?=\d)")
_APOSTROPHE = re.compile(r"(?<=\w)'(?=\w)")
_KEEP = "\x00"  # stands in for number punctuation while the rest is stripped
_MEANINGFUL = set("%#&@")  # Unicode calls these punctuation; in a prompt they change the question


class Embeds(Protocol):
    """What a key needs from an embedder: `models.templates.embeddings.Embedder` fits."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def normalise(text: str) -> str:
    """The text a semantic key embeds: NFKC, case-folded, punctuation removed (except inside
    numbers), whitespace collapsed. Symbols ($, +) and % # & @ stay: they change what is asked."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).casefold()
    kept = _INNER_NUMBER_PUNCT.sub(lambda m: _KEEP + m.group(), text)
    kept = _APOSTROPHE.sub("", kept)
    out = []
    for i, ch in enumerate(kept):
        if ch == _KEEP:
            continue
        protected = i > 0 and kept[i - 1] == _KEEP
        keep = protected or ch in _MEANINGFUL or not unicodedata.category(ch).startswith("P")
        out.append(ch if keep else " ")
    return " ".join("".join(out).split())


@cache
def simhash_planes(dimensions: int = DIMENSIONS) -> np.ndarray:
    """(64, dimensions) float32 of +-1: row i from BLAKE2b(seed, i) in counter mode."""
    rows = []
    for i in range(SIMHASH_BITS):
        stream = b"".join(
            hashlib.blake2b(SIMHASH_SEED + f":{i}:{block}".encode(), digest_size=64).digest()
            for block in range(-(-dimensions // 512))
        )
        bits = np.unpackbits(np.frombuffer(stream, dtype=np.uint8))[:dimensions]
        rows.append(bits.astype(np.float32) * 2.0 - 1.0)
    planes = np.stack(rows)
    planes.setflags(write=False)
    return planes


def projections(vectors: np.ndarray) -> np.ndarray:
    """(N, 64) projections of (N, D) vectors (or (64,) for one vector) on the SimHash planes."""
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors @ simhash_planes(vectors.shape[-1]).T


def _bits_to_int(bits: np.ndarray) -> int:
    return int.from_bytes(np.packbits(bits.astype(np.uint8)).tobytes(), "big")


def simhash64(vector: np.ndarray) -> int:
    """The 64-bit SimHash of one embedding, as an unsigned int (`SemanticKey.simhash`'s range):
    bit 63 is plane 0. A projection of exactly 0 counts as positive."""
    return _bits_to_int(projections(vector) >= 0)


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def bucket_of(simhash: int, bits: int = BUCKET_BITS) -> int:
    """The bucket: the SimHash with all but its leading `bits` bits cleared."""
    shift = SIMHASH_BITS - bits
    return (simhash >> shift) << shift


def probe_buckets(vector: np.ndarray, bits: int = BUCKET_BITS, probes: int = PROBES) -> list[int]:
    """The `probes` buckets most likely to hold a near neighbour of `vector`, best first: its own,
    then those reached by flipping bits whose projections are nearest zero (a neighbour at a small
    angle falls on the other side of those planes first), least total |projection| first, among
    the weakest log2(probes) + 2 bits (query-directed multi-probe, Lv et al. 2007).

    Rejected: every bucket within Hamming distance d. It spends probes on bits the query is far
    from flipping: on the development positives it found fewer neighbours with more probes.
    """
    z = projections(vector)[:bits]
    own = _bits_to_int(np.concatenate([z >= 0, np.zeros(SIMHASH_BITS - bits, dtype=bool)]))
    candidates = np.argsort(np.abs(z), kind="stable")[: min(bits, (probes - 1).bit_length() + 2)]
    flips = []
    for size in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates.tolist(), size):
            mask = sum(1 << (SIMHASH_BITS - 1 - i) for i in subset)
            flips.append((float(np.abs(z[list(subset)]).sum()), size, own ^ mask))
    flips.sort()
    return [bucket for _, _, bucket in flips[:probes]]


def semantic_key(tenant: str, template_id: str, text: str, embedder: Embeds) -> SemanticKey:
    """The key of `text`: its tenant, its template and the SimHash of its normalised embedding.
    Prompts equal after `normalise` always share it; near-paraphrases usually share its bucket."""
    vector = embedder.embed([normalise(text)])[0]
    return SemanticKey(tenant, template_id, simhash64(vector))


_LAZY = {
    "SemanticCache": "models.templates.semantic_cache",
    "SemanticHit": "models.templates.semantic_cache",
    "Calibration": "models.templates.semantic_calibration",
    "calibrate": "models.templates.semantic_calibration",
}


def __getattr__(name: str) -> Any:
    """The cache and its calibration live in their own modules (which import this one); they are
    re-exported here lazily so `from models.templates.semantic import SemanticCache` works."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

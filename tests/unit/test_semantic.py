"""Semantic keys and the verified semantic cache: robustness, round trip, isolation, checks."""

from __future__ import annotations

import hashlib
import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import SemanticKey, parse_key
from cache_runtime.tiers.memory import MemoryTier
from models.templates.embeddings import DIMENSIONS, Embedder
from models.templates.semantic import (
    SIMHASH_BITS,
    bucket_of,
    hamming,
    normalise,
    probe_buckets,
    semantic_key,
    simhash64,
    simhash_planes,
)
from models.templates.semantic_cache import LocalBuckets, SemanticCache, bucket_key


def _word_vector(word: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).standard_normal(DIMENSIONS)


def bag_of_words(texts: list[str]) -> np.ndarray:
    """A fake encoder: the sum of per-word random vectors, digits ignored (as blind to amounts as
    a real embedding nearly is)."""
    out = []
    for text in texts:
        words = [w for w in text.split() if not any(c.isdigit() for c in w)] or ["<empty>"]
        out.append(sum(_word_vector(w) for w in words))
    return np.asarray(out)


def fake_embedder() -> Embedder:
    return Embedder(encode=bag_of_words)


class Fixed:
    """An embedder answering from a table: exact control of every similarity."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = {normalise(k): v / np.linalg.norm(v) for k, v in table.items()}

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


words = st.lists(st.text(string.ascii_lowercase, min_size=1, max_size=8), min_size=1, max_size=8)
spaces = st.sampled_from([" ", "  ", "\t", "\n", " \u00a0"])
marks = st.sampled_from(["", "", "?", "!", ",", ".", ";", ":", '"', "(", ")", "...", "\u2026"])


@st.composite
def perturbed(draw: st.DrawFn) -> tuple[str, str]:
    """A sentence and a copy with other whitespace, case and punctuation around its words."""
    ws = draw(words)
    out = draw(marks)
    for i, w in enumerate(ws):
        cased = "".join(c.upper() if draw(st.booleans()) else c for c in w)
        out += cased + draw(marks) + (draw(spaces) if i < len(ws) - 1 else "")
    return " ".join(ws), draw(spaces.map(str.strip)) + out + draw(marks)


@given(perturbed())
def test_normalise_ignores_whitespace_case_and_punctuation(pair: tuple[str, str]) -> None:
    plain, noisy = pair
    assert normalise(noisy) == normalise(plain) == plain


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What\u2019s the price?", "whats the price"),
        ("Ｆｕｌｌｗｉｄｔｈ  text", "fullwidth text"),  # NFKC
        ("pay $1,000.50 on 2024-03-01!", "Pay $1,000.50 on 2024-03-01"),
    ],
)
def test_normalise_examples(a: str, b: str) -> None:
    assert normalise(a) == normalise(b)


def test_normalise_keeps_punctuation_inside_numbers() -> None:
    assert normalise("3.5% of 1,000") == "3.5% of 1,000"
    assert normalise("3.5") != normalise("35")


@settings(max_examples=50, deadline=None)
@given(perturbed(), st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_semantic_key_is_robust_and_round_trips(
    pair: tuple[str, str], tenant: str, template: str
) -> None:
    embedder = fake_embedder()
    key = semantic_key(tenant, template, pair[0], embedder)
    assert semantic_key(tenant, template, pair[1], embedder) == key
    assert SemanticKey.from_string(key.to_string()) == key == parse_key(key.to_string())
    assert bucket_key(key).simhash == bucket_of(key.simhash)


def test_simhash_is_stable_across_processes_and_versions() -> None:
    """Golden values: a change here changes every stored key (bump KEY_FORMAT_VERSION)."""
    planes = simhash_planes()
    assert planes.shape == (SIMHASH_BITS, DIMENSIONS) and set(np.unique(planes)) == {-1.0, 1.0}
    vector = np.cos(np.arange(DIMENSIONS, dtype=np.float32))
    vector /= np.linalg.norm(vector)
    assert f"{simhash64(vector):016x}" == "329ba7e4f7888991"
    assert simhash64(vector) == simhash64(vector.copy()) and simhash64(-vector) == ~simhash64(
        vector
    ) & (2**64 - 1)


def test_simhash_hamming_distance_tracks_the_angle() -> None:
    """Random-hyperplane SimHash: E[hamming] = 64 * angle / pi."""
    rng = np.random.default_rng(0)
    for angle in (0.2, 0.6, 1.2):
        distances = []
        for _ in range(300):
            a, r = rng.standard_normal((2, DIMENSIONS))
            a /= np.linalg.norm(a)
            r -= (r @ a) * a
            r /= np.linalg.norm(r)
            b = np.cos(angle) * a + np.sin(angle) * r
            distances.append(hamming(simhash64(a), simhash64(b)))
        assert np.mean(distances) == pytest.approx(64 * angle / np.pi, rel=0.1)


def test_probes_start_at_the_own_bucket_and_are_distinct() -> None:
    vector = bag_of_words(["some prompt"])[0]
    probes = probe_buckets(vector, bits=8, probes=16)
    assert probes[0] == bucket_of(simhash64(vector), 8)
    assert len(set(probes)) == 16
    assert all(hamming(p, probes[0]) <= 4 for p in probes)


def test_a_lookup_never_crosses_tenants_or_templates() -> None:
    store = LocalBuckets()
    cache = SemanticCache(fake_embedder(), 0.9, store)
    cache.put("acme", "faq", "what is the refund policy", "30 days")
    assert cache.get("acme", "faq", "What is the refund policy?") == "30 days"
    assert cache.get("globex", "faq", "what is the refund policy") is None
    assert cache.get("acme", "other", "what is the refund policy") is None
    assert len(store) == 1


def test_verification_rejects_a_below_threshold_neighbour_in_the_same_bucket() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(DIMENSIONS)
    a /= np.linalg.norm(a)
    noise = rng.standard_normal(DIMENSIONS)
    noise -= (noise @ a) * a
    b = 0.9 * a + np.sqrt(1 - 0.81) * noise / np.linalg.norm(noise)  # cosine 0.9 exactly
    # the same content words (the guards let them through): only the cosine tells them apart
    embedder = Fixed({"stored prompt": a, "the stored prompt?": b})
    strict = SemanticCache(embedder, 0.95)
    strict.put("t", "x", "stored prompt", "answer")
    stored_bucket = bucket_of(simhash64(a))
    assert stored_bucket in probe_buckets(b)  # the lookup reaches the stored entry ...
    assert strict.get("t", "x", "the stored prompt?") is None  # ... and verification refuses it
    lenient = SemanticCache(embedder, 0.85, strict.store)
    hit = lenient.lookup("t", "x", "the stored prompt?")
    assert hit is not None and hit.prompt == "stored prompt"
    assert hit.similarity == pytest.approx(0.9, abs=1e-5)


def test_guards_veto_what_the_embedding_cannot_see() -> None:
    cache = SemanticCache(fake_embedder(), 0.99)  # the fake ignores digits: cosine 1.0
    cache.put("t", "x", "transfer 100 dollars to savings", "done: 100")
    assert cache.get("t", "x", "transfer 1000 dollars to savings") is None
    assert cache.get("t", "x", "Transfer 100 dollars to savings!") == "done: 100"
    assert cache.decision_score("send 100 dollars", "send 1000 dollars") == -2.0
    unguarded = SemanticCache(fake_embedder(), 0.99, cache.store, use_guards=False)
    assert unguarded.get("t", "x", "transfer 1000 dollars to savings") == "done: 100"


def test_put_replaces_the_same_prompt_and_bounds_a_bucket() -> None:
    embedder = Fixed({f"p{i}": np.ones(DIMENSIONS) + 1e-3 * i for i in range(5)})
    cache = SemanticCache(embedder, 0.5, bucket_capacity=3)
    cache.put("t", "x", "p0", "old")
    cache.put("t", "x", "P0", "new")  # same normalised prompt
    assert cache.get("t", "x", "p0") == "new"
    for i in range(1, 5):
        cache.put("t", "x", f"p{i}", f"answer {i}")
    assert cache.lookup("t", "x", "p4").response == "answer 4"  # type: ignore[union-attr]
    entries = cache.store.get(bucket_key(semantic_key("t", "x", "p4", embedder)))  # type: ignore[arg-type]
    assert entries is not None and entries.count(b'"prompt"') == 3


def test_semantic_cache_over_a_hybrid_cache() -> None:
    hybrid = HybridCache([MemoryTier(1 << 20)])
    try:
        cache = SemanticCache(fake_embedder(), 0.9, hybrid)
        key = cache.put("acme", "faq", "how do I reset my password", "use the link")
        assert parse_key(key.to_string()) == key
        assert cache.get("acme", "faq", "How do I reset my password?") == "use the link"
        assert cache.get("globex", "faq", "how do I reset my password") is None
    finally:
        hybrid.close()


@pytest.mark.slow
def test_real_minilm_keys_and_hits() -> None:
    """The one test with the real model: surface changes share the key, a typo and a rephrasing
    still hit at a moderate threshold, a different question does not."""
    embedder = Embedder()
    cache = SemanticCache(embedder, 0.8)
    stored = "What is the capital of France?"
    assert semantic_key("t", "x", "  what is the CAPITAL of france  ", embedder) == semantic_key(
        "t", "x", stored, embedder
    )
    cache.put("t", "x", stored, "Paris")
    assert cache.get("t", "x", "what is the capital of france") == "Paris"
    assert cache.get("t", "x", "what is the capitol of France") == "Paris"
    assert cache.get("t", "x", "tell me the capital of France") == "Paris"
    assert cache.get("t", "x", "what is the capital of Germany") is None
    assert cache.get("t", "x", "how do I bake sourdough bread") is None


def test_garbage_buckets_miss_and_stale_calibrations_are_refused() -> None:
    import dataclasses

    from models.templates.semantic_calibration import calibrate

    store = LocalBuckets()
    cache = SemanticCache(fake_embedder(), 0.5, store)
    key = bucket_key(semantic_key("t", "x", "hello there", cache.embedder))
    for junk in (b"not json", b'{"v": 99, "entries": []}', b'{"v": 1, "entries": [{"a": 1}]}'):
        store.put(key, junk)
        assert cache.get("t", "x", "hello there") is None
    calibration = calibrate([(0.1 * i, 0) for i in range(10)] + [(0.95, 1)], 0.2, rule="empirical")
    with pytest.raises(ValueError, match="recalibrate"):
        SemanticCache(fake_embedder(), dataclasses.replace(calibration, key_format_version=99))

"""The embedder: unit vectors, each distinct text embedded once, bounded cache."""

from __future__ import annotations

import numpy as np

from models.templates.embeddings import DIMENSIONS, Embedder


def _fake(calls: list[list[str]]):  # type: ignore[no-untyped-def]
    def encode(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.array([[len(t), 1.0] + [0.0] * (DIMENSIONS - 2) for t in texts])

    return encode


def test_vectors_are_unit_length_and_in_input_order() -> None:
    embedder = Embedder(encode=_fake([]))
    vectors = embedder.embed(["a", "bbb", "a"])
    assert vectors.shape == (3, DIMENSIONS) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(vectors[0], vectors[2])
    assert vectors[1][0] > vectors[0][0]  # "bbb" has the larger first coordinate


def test_each_distinct_text_is_encoded_once() -> None:
    calls: list[list[str]] = []
    embedder = Embedder(encode=_fake(calls))
    embedder.embed(["x", "y", "x"])
    embedder.embed(["y", "z"])
    assert calls == [["x", "y"], ["z"]] and embedder.encoded == 3


def test_cache_is_bounded_and_evicts_the_least_recent() -> None:
    calls: list[list[str]] = []
    embedder = Embedder(encode=_fake(calls), cache_size=2)
    embedder.embed(["a", "b"])
    embedder.embed(["a"])  # a is now the most recent
    embedder.embed(["c"])  # evicts b
    embedder.embed(["a", "b"])
    assert calls[-1] == ["b"]

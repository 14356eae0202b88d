"""Development pairs, the GPTCache adapter's threshold conversion, and the semantic bench."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import invoke_cli
from test_semantic import bag_of_words

from models.evaluation.bench.semantic_bench import bench_semantic, rates, split_half
from models.templates.embeddings import DIMENSIONS, Embedder
from models.templates.guards import guard_violations, guards_pass
from models.templates.pairs import (
    Pair,
    build_guard_pairs,
    build_pairs,
    load_corpus,
    read_pairs,
    write_pairs,
)
from models.templates.semantic_gptcache import (
    GPTCachePeer,
    cosine_for_similarity_threshold,
    similarity_threshold_for_cosine,
)


def test_fallback_corpus_gives_seeded_pairs_of_both_labels(tmp_path: Path) -> None:
    corpus = load_corpus(tmp_path / "missing")
    pairs = build_pairs(corpus, 200, seed=3)
    assert build_pairs(corpus, 200, seed=3) == pairs
    assert {p.label for p in pairs} == {0, 1} and len(pairs) >= 150
    positives = [p for p in pairs if p.label == 1]
    entities = sum(guards_pass(p.text_a, p.text_b, content=False) for p in positives)
    assert entities >= 0.98 * len(positives)  # a rewrite changes no number, date or negation
    # the content guard's price: a typo in a 4-letter word, or in a synonym, reads as a change
    assert sum(guards_pass(p.text_a, p.text_b) for p in positives) >= 0.9 * len(positives)
    assert all(p.text_a != p.text_b for p in pairs)


def test_every_guard_pair_differs_in_a_guarded_entity(tmp_path: Path) -> None:
    guards = build_guard_pairs(load_corpus(None), per_category=20, seed=1)
    kinds = {p.kind for p in guards}
    assert kinds == {f"guard:{k}" for k in ("amount", "date", "identifier", "ticker", "percent",
                                             "negation")}  # fmt: skip
    assert all(p.label == 0 and guard_violations(p.text_a, p.text_b) for p in guards)


def test_pairs_files_round_trip_as_jsonl_and_json_list(tmp_path: Path) -> None:
    pairs = [Pair("a b", "a  b", 1, "surface"), Pair("x", "y", 0, "random")]
    write_pairs(pairs, tmp_path / "p.jsonl")
    assert read_pairs(tmp_path / "p.jsonl") == pairs
    (tmp_path / "p.json").write_text('[{"text_a": "x", "text_b": "y", "label": 0}]')
    assert read_pairs(tmp_path / "p.json") == [Pair("x", "y", 0)]
    (tmp_path / "bad.jsonl").write_text('{"text_a": "x", "text_b": "y", "label": 2}\n')
    with pytest.raises(ValueError, match="record 1"):
        read_pairs(tmp_path / "bad.jsonl")


class _Angles:
    """Unit vectors with a chosen cosine between "a<i>" and "b<i>"."""

    def __init__(self, cosines: list[float]) -> None:
        rng = np.random.default_rng(0)
        self.table: dict[str, np.ndarray] = {}
        for i, c in enumerate(cosines):
            a, r = rng.standard_normal((2, DIMENSIONS))
            a /= np.linalg.norm(a)
            r -= (r @ a) * a
            r /= np.linalg.norm(r)
            self.table[f"a{i}"], self.table[f"b{i}"] = a, c * a + np.sqrt(1 - c * c) * r

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def test_gptcache_threshold_conversion_matches_its_hits() -> None:
    """GPTCache's similarity_threshold t hits exactly when cosine >= 2t - 1 (faiss squared L2,
    SearchDistanceEvaluation(max_distance=4)): checked on its own lookups."""
    cosines = [0.95, 0.85, 0.6, 0.1, -0.3]
    assert similarity_threshold_for_cosine(0.8) == pytest.approx(0.9)
    assert cosine_for_similarity_threshold(similarity_threshold_for_cosine(0.37)) == pytest.approx(
        0.37
    )
    with GPTCachePeer(_Angles(cosines)) as peer:
        for i, c in enumerate(cosines):
            t = similarity_threshold_for_cosine(c)
            assert peer.hits(f"a{i}", f"b{i}", [t - 1e-4, t + 1e-4]) == [True, False]
            assert peer.score(f"a{i}", f"b{i}") == pytest.approx(t, abs=1e-5)
        assert peer.hits("a0", "b1", [0.0]) == [True]  # only what was just stored is there


def test_split_and_rates() -> None:
    labels = [0] * 10 + [1] * 6
    calib, held = split_half(labels, seed=0)
    assert sorted([*calib, *held]) == list(range(16))
    assert sum(labels[i] for i in calib) == 3
    got = rates([True, True, False, True], [1, 0, 1, 0])
    assert got == {"precision": 0.3333, "recall": 0.5, "false_hit_rate": 1.0, "hits": 3,
                   "false_hits": 2}  # fmt: skip


def test_bench_semantic_reports_both_systems_and_the_guards() -> None:
    corpus = load_corpus(None)
    pairs = build_pairs(corpus, 120, seed=0)
    guards = build_guard_pairs(corpus, per_category=4, seed=0)
    result = bench_semantic(pairs, 0.05, 0, guards, Embedder(encode=bag_of_words))
    assert result["pairs"] == len(pairs) and result["target_fhr"] == 0.05
    assert set(result["preheat"]) >= {"threshold", "precision", "recall", "false_hit_rate"}
    assert set(result["gptcache"]["fixed"]) == {"0.8", "0.85", "0.9"}
    assert set(result["gptcache"]["calibrated"]) >= {"similarity_threshold", "recall"}
    assert result["guards"]["pairs"] == len(guards) and result["guards"]["false_hits"] == 0
    assert set(result["calibration_rules"]) == {"clopper-pearson", "plus-one", "empirical"}
    assert result["split_robustness"]["splits"] == 200


def test_cli_rejects_a_bad_pairs_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"text_a": "x"}\n')
    done = invoke_cli("bench", "semantic", "--pairs", str(bad), "--json", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"preheat: error: {bad}: record 1 needs text_a, text_b (strings), label 0|1"
    ]

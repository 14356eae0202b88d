"""`preheat bench semantic`: calibrated semantic hits, preheat next to GPTCache, on labelled pairs.

The pairs are split in two halves, stratified by label and seeded: each system's threshold is
calibrated on one half to the target false-hit rate (the same rule for both,
`semantic_calibration.calibrate`), then both are measured on the other half by their real lookups:
preheat's `SemanticCache` (bucket probes, cosine, guards) and GPTCache's `get` (faiss,
SearchDistanceEvaluation), each holding one pair's first prompt and asked for the second. GPTCache
also runs at its usual fixed thresholds (cosine 0.8, 0.85, 0.9, converted to its scale).

The guard set (label-0 pairs differing only in an amount, a date, an identifier, a ticker, a
percentage or a negation) is measured apart: a false hit there is an answer about 100 dollars
served for 1000. Pairs in the input whose `kind` starts with "guard" join that set. So is the
entity-substitution set (`substitutions`: a changed card tier, product, currency direction,
place, period, comparative, action, account or loan type, instrument or institution): a false
hit there is the silver card's limit served for the gold card.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from models.templates.embeddings import Embedder, shared_embedder
from models.templates.pairs import Pair
from models.templates.semantic import normalise
from models.templates.semantic_cache import LocalBuckets, SemanticCache
from models.templates.semantic_calibration import (
    Calibration,
    calibrate,
    calibration_check,
    choose_threshold,
)
from models.templates.semantic_gptcache import (
    GPTCachePeer,
    cosine_for_similarity_threshold,
    gptcache_available,
    similarity_threshold_for_cosine,
)

FIXED_COSINES = ("0.8", "0.85", "0.9")
TENANT, TEMPLATE = "bench", "semantic"
_CALIBRATION_FIELDS = (
    "rule", "n_negatives", "n_positives", "achieved_fhr_on_calibration", "recall_on_calibration",
    "fhr_bound", "certified", "data_digest",
)  # fmt: skip

Progress = Callable[[str], None]


def split_half(labels: Sequence[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the calibration and evaluation halves, each label split evenly."""
    rng = np.random.default_rng(seed)
    labels_arr = np.asarray(labels)
    calib = np.zeros(len(labels_arr), dtype=bool)
    for label in (0, 1):
        idx = np.flatnonzero(labels_arr == label)
        calib[rng.permutation(idx)[: len(idx) // 2]] = True
    return np.flatnonzero(calib), np.flatnonzero(~calib)


def rates(hits: Sequence[bool], labels: Sequence[int]) -> dict[str, Any]:
    """Precision, recall and false-hit rate of hit decisions against labels (1 = may share)."""
    h, y = np.asarray(hits, dtype=bool), np.asarray(labels) == 1
    tp, fp = int((h & y).sum()), int((h & ~y).sum())
    return {
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / int(y.sum()), 4) if y.any() else None,
        "false_hit_rate": round(fp / int((~y).sum()), 4) if (~y).any() else None,
        "hits": tp + fp,
        "false_hits": fp,
    }


def _preheat_hit(embedder: Embedder, calibration: Calibration, a: str, b: str) -> bool:
    """A cache holding only `a`'s answer, asked for `b`: the real lookup, probes and all."""
    cache = SemanticCache(embedder, calibration, LocalBuckets())
    cache.put(TENANT, TEMPLATE, a, "cached answer")
    return cache.lookup(TENANT, TEMPLATE, b) is not None


def _bench_preheat(
    embedder: Embedder, pairs: Sequence[Pair], calib: np.ndarray, held: np.ndarray,
    target_fhr: float, guard_pairs: Sequence[Pair], progress: Progress,
) -> tuple[dict[str, Any], dict[str, Any], np.ndarray, Calibration]:  # fmt: skip
    probe = SemanticCache(embedder, 1.0)
    scores = np.asarray([probe.decision_score(p.text_a, p.text_b) for p in pairs])
    labels = np.asarray([p.label for p in pairs])
    calibration = calibrate(zip(scores[calib], labels[calib], strict=True), target_fhr)
    progress(f"preheat: threshold {calibration.threshold:.4f}; evaluating")
    hits = [_preheat_hit(embedder, calibration, pairs[i].text_a, pairs[i].text_b) for i in held]
    above = scores[held] >= calibration.threshold
    result = {
        "threshold": round(calibration.threshold, 6),
        **rates(hits, labels[held]),
        "bucket_misses": int((above & ~np.asarray(hits)).sum()),  # verified, but not probed
        "calibration": {k: getattr(calibration, k) for k in _CALIBRATION_FIELDS},
    }
    return result, _false_hits(embedder, calibration, guard_pairs), scores, calibration


def _false_hits(
    embedder: Embedder, calibration: Calibration, label_0: Sequence[Pair]
) -> dict[str, Any]:
    """How many of these label-0 pairs preheat's real lookup serves, by category."""
    hits = [_preheat_hit(embedder, calibration, p.text_a, p.text_b) for p in label_0]
    return {
        "pairs": len(label_0),
        "false_hits": int(sum(hits)),
        "false_hits_by_category": dict(
            Counter(p.kind for p, h in zip(label_0, hits, strict=True) if h)
        ),
        "categories": dict(Counter(p.kind for p in label_0)),
    }


def _bench_gptcache(
    embedder: Embedder, pairs: Sequence[Pair], calib: np.ndarray, held: np.ndarray,
    target_fhr: float, guard_pairs: Sequence[Pair], progress: Progress,
    substitution_pairs: Sequence[Pair] = (),
) -> tuple[dict[str, Any], int, int]:  # fmt: skip
    labels = np.asarray([p.label for p in pairs])
    with GPTCachePeer(embedder) as peer:
        progress("gptcache: calibrating")
        scores = [peer.score(pairs[i].text_a, pairs[i].text_b) for i in calib]
        calibration = calibrate(zip(scores, labels[calib], strict=True), target_fhr)
        thresholds = [calibration.threshold] + [
            similarity_threshold_for_cosine(float(c)) for c in FIXED_COSINES
        ]
        progress("gptcache: evaluating")
        decisions = np.asarray(
            [peer.hits(pairs[i].text_a, pairs[i].text_b, thresholds) for i in held]
        )
        guard_hits = sum(peer.hits(p.text_a, p.text_b, thresholds[:1])[0] for p in guard_pairs)
        substitution_hits = sum(
            peer.hits(p.text_a, p.text_b, thresholds[:1])[0] for p in substitution_pairs
        )
    calibrated = {
        "similarity_threshold": round(calibration.threshold, 6),
        "cosine": round(cosine_for_similarity_threshold(calibration.threshold), 6),
        **rates(decisions[:, 0], labels[held]),
    }
    fixed = {
        c: {"similarity_threshold": round(t, 6), **rates(decisions[:, j + 1], labels[held])}
        for j, (c, t) in enumerate(zip(FIXED_COSINES, thresholds[1:], strict=True))
    }
    return {"calibrated": calibrated, "fixed": fixed}, int(guard_hits), int(substitution_hits)


def split_robustness(
    embedder: Embedder, pairs: Sequence[Pair], preheat_scores: np.ndarray, target_fhr: float,
    splits: int = 200, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Both systems' recall at their calibrated thresholds over many random splits, from scores
    (GPTCache's is (1 + cosine of the raw prompts) / 2, as its own lookups confirm): one split's
    recall gap moves by a few points with which negatives land in the calibration half."""
    a = embedder.embed([p.text_a for p in pairs])
    b = embedder.embed([p.text_b for p in pairs])
    gpt_scores = (1.0 + (a * b).sum(axis=1)) / 2.0
    labels = np.asarray([p.label for p in pairs])
    gaps, recalls = [], {"preheat": [], "gptcache": []}
    for i in range(splits):
        calib, held = split_half(labels, seed + 1 + i)
        for name, scores in (("preheat", preheat_scores), ("gptcache", gpt_scores)):
            t, _, _ = choose_threshold(
                scores[calib], labels[calib], target_fhr, "clopper-pearson", 0.95
            )
            recalls[name].append(float((scores[held][labels[held] == 1] >= t).mean()))
        gaps.append(recalls["gptcache"][-1] - recalls["preheat"][-1])
    return {
        "splits": splits,
        "preheat_mean_recall": round(float(np.mean(recalls["preheat"])), 4),
        "gptcache_mean_recall": round(float(np.mean(recalls["gptcache"])), 4),
        "mean_recall_gap": round(float(np.mean(gaps)), 4),
        "share_of_splits_gap_over_0.02": round(float(np.mean(np.asarray(gaps) > 0.02)), 3),
    }


def bench_semantic(
    pairs: Sequence[Pair],
    target_fhr: float = 0.01,
    seed: int = 0,
    guard_pairs: Sequence[Pair] = (),
    embedder: Embedder | None = None,
    progress: Progress | None = None,
    with_gptcache: bool = True,
    substitution_pairs: Sequence[Pair] = (),
) -> dict[str, Any]:
    """The JSON of `preheat bench semantic` (module docstring). `substitution_pairs`: the
    entity-substitution set (`models.templates.substitutions`), measured like the guard set."""
    started = time.perf_counter()
    say = progress or (lambda _: None)
    guards = [*guard_pairs, *(p for p in pairs if p.kind.startswith("guard"))]
    pairs = [p for p in pairs if not p.kind.startswith("guard")]
    labels = [p.label for p in pairs]
    if len(set(labels)) < 2:
        raise ValueError("the pairs need both labels (0 and 1)")
    embedder = embedder or shared_embedder()
    texts = {t for p in [*pairs, *guards, *substitution_pairs] for t in (p.text_a, p.text_b)}
    say(f"embedding {len(texts)} prompts")
    embedder.embed(sorted(texts | {normalise(t) for t in texts}, key=len))
    calib, held = split_half(labels, seed)
    preheat, guard_result, scores, calibration = _bench_preheat(
        embedder, pairs, calib, held, target_fhr, guards, say
    )
    result: dict[str, Any] = {"pairs": len(pairs), "target_fhr": target_fhr, "seed": seed}
    result["preheat"] = preheat
    missing = gptcache_available() if with_gptcache else "not run (with_gptcache=False)"
    substitutions = _false_hits(embedder, calibration, substitution_pairs)
    if missing is None:
        result["gptcache"], guard_hits, substitution_hits = _bench_gptcache(
            embedder, pairs, calib, held, target_fhr, guards, say, substitution_pairs
        )
        guard_result["gptcache_false_hits_at_calibrated"] = guard_hits
        substitutions["gptcache_false_hits_at_calibrated"] = substitution_hits
    else:
        result["gptcache"] = {"error": missing}
    result["guards"] = guard_result
    result["substitutions"] = substitutions
    say("checking the calibration rules over 200 splits")
    result["calibration_rules"] = calibration_check(scores, np.asarray(labels), target_fhr)
    result["split_robustness"] = split_robustness(embedder, pairs, scores, target_fhr)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result

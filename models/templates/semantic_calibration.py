"""The similarity threshold of a semantic hit, calibrated to a false-hit rate on labelled pairs.

A pair's decision score is the cosine of the two normalised prompts' embeddings, or `VETOED` when
a guard tells them apart (they can never share an answer, whatever the threshold). `calibrate`
picks the smallest threshold whose false-hit rate (share of label-0 pairs scoring at or above it)
is at most the target, and chooses conservatively, because the promise is about pairs it has not
seen:

- "clopper-pearson" (default): the one-sided 95% Clopper-Pearson upper bound of the false-hit rate
  must be <= target: for a 1% target, at most 6 of 1,200 negatives (0.5%) may clear it.
- "plus-one": (k + 1) / (n + 1) <= target: the conformal correction, right on average.
- "empirical": k / n <= target.

Measured by `calibration_check` over 200 random half/half splits of the development pairs (1,200
negatives per half, target 1%): Clopper-Pearson realised a mean false-hit rate of 0.55% on the
held-out half, above 1% in 6.5% of splits and above 2% in none, at mean recall 0.729;
plus-one 1.00% (above 1% in 43% of splits, above 2% in 0.5%) at recall 0.782; empirical 1.10%
(49%, 2.5%) at 0.790. A promise about unseen pairs is what the cache makes, so the default pays
~5 points of recall for it. With too few negatives to certify the target at all (under ~300 for
1%) the threshold sits just above the highest negative and `certified` is False.

A `Calibration` is self-describing JSON: the threshold, the rule, the counts, the scores and labels
it was computed from and their digest, the embedding model and the key-format version.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import orjson

from cache_runtime.keys import KEY_FORMAT_VERSION
from models.templates.embeddings import MODEL_ID

VETOED = -2.0  # decision score of a pair the guards tell apart: below every cosine
RULES = ("clopper-pearson", "plus-one", "empirical")


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n in the tens of thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        + i * math.log(p) + (n - i) * math.log1p(-p)
        for i in range(k + 1)
    ]  # fmt: skip
    top = max(logs)
    return math.exp(top) * sum(math.exp(v - top) for v in logs)


def fhr_upper_bound(false_hits: int, negatives: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper confidence bound of a rate seen as false_hits/negatives."""
    if negatives <= 0:
        return 1.0
    if false_hits >= negatives:
        return 1.0
    if false_hits == 0:  # closed form
        return 1.0 - (1.0 - confidence) ** (1.0 / negatives)
    lo, hi = false_hits / negatives, 1.0
    for _ in range(100):  # bisection: the CDF falls as p rises
        mid = (lo + hi) / 2
        if _binomial_cdf(false_hits, negatives, mid) > 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return hi


def _rate_bound(rule: str, k: int, n: int, confidence: float) -> float:
    if rule == "clopper-pearson":
        return fhr_upper_bound(k, n, confidence)
    if rule == "plus-one":
        return (k + 1) / (n + 1)
    if rule == "empirical":
        return k / n
    raise ValueError(f"unknown calibration rule {rule!r}; choose one of {', '.join(RULES)}")


@dataclass(frozen=True)
class Calibration:
    """A threshold and everything needed to audit it."""

    threshold: float
    target_fhr: float
    n_pairs: int
    achieved_fhr_on_calibration: float
    recall_on_calibration: float
    data_digest: str
    rule: str = "clopper-pearson"
    confidence: float = 0.95
    n_negatives: int = 0
    n_positives: int = 0
    fhr_bound: float = 0.0  # the rule's bound at the chosen threshold
    certified: bool = True  # False: too few negatives for the bound to reach the target
    score: str = "cosine of normalised MiniLM embeddings; guard-vetoed pairs score -2"
    model_id: str = MODEL_ID
    key_format_version: int = KEY_FORMAT_VERSION
    scores: tuple[float, ...] = ()
    labels: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    def save(self, path: Path) -> None:
        Path(path).write_bytes(self.to_json())

    @classmethod
    def from_json(cls, data: bytes | str) -> Calibration:
        raw = orjson.loads(data)
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown calibration fields: {sorted(unknown)}")
        raw["scores"] = tuple(raw.get("scores", ()))
        raw["labels"] = tuple(raw.get("labels", ()))
        calibration = cls(**raw)
        if calibration.scores and digest(calibration.scores, calibration.labels) != (
            calibration.data_digest
        ):
            raise ValueError("calibration data does not match its digest")
        return calibration

    @classmethod
    def load(cls, path: Path) -> Calibration:
        return cls.from_json(Path(path).read_bytes())


def digest(scores: Iterable[float], labels: Iterable[int]) -> str:
    """SHA-256 (first 16 hex digits) of the scores (float64) and labels, in order."""
    s = np.asarray(list(scores), dtype=np.float64).tobytes()
    y = np.asarray(list(labels), dtype=np.int8).tobytes()
    return hashlib.sha256(s + b"|" + y).hexdigest()[:16]


def choose_threshold(
    scores: np.ndarray, labels: np.ndarray, target_fhr: float, rule: str, confidence: float
) -> tuple[float, int, bool]:
    """(threshold, negatives at or above it, certified). The threshold is one float step above
    the highest negative that must be excluded, so ties never count as allowed false hits."""
    negatives = np.sort(scores[labels == 0])[::-1]  # highest first
    n = len(negatives)
    if n == 0:
        raise ValueError("calibration needs label-0 pairs")
    allowed = -1  # the most false hits the rule accepts
    for k in range(n + 1):
        if _rate_bound(rule, k, n, confidence) > target_fhr:
            break
        allowed = k
    certified = allowed >= 0
    allowed = max(allowed, 0)
    if allowed >= n:
        return -1.0, n, certified  # every negative may hit: any cosine passes
    threshold = float(np.nextafter(np.float64(negatives[allowed]), np.inf))
    return threshold, int((negatives >= threshold).sum()), certified


def calibrate(
    pairs: Iterable[tuple[float, int]],
    target_fhr: float = 0.01,
    *,
    rule: str = "clopper-pearson",
    confidence: float = 0.95,
    keep_data: bool = True,
) -> Calibration:
    """The smallest threshold meeting `target_fhr` under `rule` on `(score, label)` pairs."""
    if not 0.0 < target_fhr < 1.0:
        raise ValueError(f"target_fhr must be in (0, 1), got {target_fhr}")
    rows = list(pairs)
    scores = np.asarray([float(s) for s, _ in rows], dtype=np.float64)
    labels = np.asarray([int(y) for _, y in rows], dtype=np.int8)
    if not set(labels.tolist()) <= {0, 1}:
        raise ValueError("labels must be 0 or 1")
    threshold, false_hits, certified = choose_threshold(
        scores, labels, target_fhr, rule, confidence
    )
    n_neg, n_pos = int((labels == 0).sum()), int((labels == 1).sum())
    recall = float((scores[labels == 1] >= threshold).mean()) if n_pos else 0.0
    return Calibration(
        threshold=threshold,
        target_fhr=target_fhr,
        n_pairs=len(rows),
        achieved_fhr_on_calibration=false_hits / n_neg,
        recall_on_calibration=recall,
        data_digest=digest(scores, labels),
        rule=rule,
        confidence=confidence,
        n_negatives=n_neg,
        n_positives=n_pos,
        fhr_bound=_rate_bound(rule, false_hits, n_neg, confidence),
        certified=certified,
        scores=tuple(scores.tolist()) if keep_data else (),
        labels=tuple(labels.tolist()) if keep_data else (),
    )


def calibration_check(
    scores: np.ndarray,
    labels: np.ndarray,
    target_fhr: float = 0.01,
    splits: int = 200,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Each rule over `splits` random half/half splits (stratified by label): the false-hit rate
    it then realises on the held-out half, and the recall it keeps. What "conservative" buys."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, float]] = {}
    for rule in RULES:
        fhr, recall = [], []
        for _ in range(splits):
            calib = np.zeros(len(scores), dtype=bool)
            for label in (0, 1):
                idx = np.flatnonzero(labels == label)
                calib[rng.permutation(idx)[: len(idx) // 2]] = True
            t, _, _ = choose_threshold(scores[calib], labels[calib], target_fhr, rule, 0.95)
            held_out = ~calib
            fhr.append(float((scores[held_out & (labels == 0)] >= t).mean()))
            recall.append(float((scores[held_out & (labels == 1)] >= t).mean()))
        arr = np.asarray(fhr)
        out[rule] = {
            "mean_fhr": round(float(arr.mean()), 5),
            "p95_fhr": round(float(np.quantile(arr, 0.95)), 5),
            "share_over_target": round(float((arr > target_fhr).mean()), 3),
            "share_over_2x_target": round(float((arr > 2 * target_fhr).mean()), 3),
            "mean_recall": round(float(np.mean(recall)), 4),
        }
    return out

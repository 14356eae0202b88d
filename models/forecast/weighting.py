"""Long-tail sample weights: rare, complex, irregular keys get drawn more often in training.

A panel trained on raw samples learns the few keys that carry most of the traffic and predicts
the tail as noise, yet warming a tail key before its burst is where prediction pays most (the
head is warm anyway). `tail_weight` is the seed design's form
`exp(0.3 * (depth + entropy)) / (freq + 1e-3)`:

- `depth`: structural complexity of the key (prefix blocks in its chain, slots in its template;
  1 where the key has no structure) — deeper keys are costlier to prefill, so worth learning;
- `entropy`: Shannon entropy (nats) of the key's demand over its train buckets — demand spread
  over many buckets is harder to predict than a key seen once;
- `freq`: the key's share of all train requests, in [0, 1] — the more frequent, the less weight.

Weights are then normalised to mean 1 and capped (`cap` times the median) so one freak key cannot
make up most batches; the cap is the guard the formula lacks on its own.
"""

from __future__ import annotations

import numpy as np

ALPHA = 0.3
FREQ_FLOOR = 1e-3


def tail_weight(depth: np.ndarray, entropy: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """exp(0.3 * (depth + entropy)) / (freq + 1e-3), element-wise; inputs must be finite, >= 0."""
    depth, entropy, freq = (np.asarray(a, dtype=np.float64) for a in (depth, entropy, freq))
    for name, values in (("depth", depth), ("entropy", entropy), ("freq", freq)):
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError(f"{name} must be finite and non-negative")
    if np.any(freq > 1):
        raise ValueError("freq is a share of all requests and must lie in [0, 1]")
    return np.exp(ALPHA * (depth + entropy)) / (freq + FREQ_FLOOR)


def demand_entropy(counts: np.ndarray) -> np.ndarray:
    """(K,) entropy in nats of each key's demand over buckets, from (K, T) counts; 0 if none."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    logs = np.log(shares, out=np.zeros_like(shares), where=shares > 0)
    return -(shares * logs).sum(axis=1)


def key_weights(
    counts: np.ndarray, depth: np.ndarray | None = None, cap: float = 50.0
) -> np.ndarray:
    """(K,) normalised per-key weights from (K, T) train counts: mean 1, at most `cap` x median."""
    counts = np.asarray(counts, dtype=np.float64)
    depth = np.ones(len(counts)) if depth is None else np.asarray(depth, dtype=np.float64)
    total = counts.sum()
    freq = counts.sum(axis=1) / total if total > 0 else np.zeros(len(counts))
    raw = tail_weight(depth, demand_entropy(counts), freq)
    raw = np.minimum(raw, cap * np.median(raw))
    return raw / raw.mean()

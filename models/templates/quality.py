"""Quality of a template mining: agreement with labels where they exist, coverage and silhouette.

Unassigned prompts (None or -1, in either labelling) count as singletons for ARI and NMI: a
one-off merged into a template is a wrong pair, and a template left unassigned loses its pairs.
Silhouette is computed on assigned prompts only (cosine, on the given embeddings), on a seeded
sample when large, and only where it is defined (at least two templates and not every prompt
in its own template); otherwise it is None.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

SILHOUETTE_SAMPLE = 2_000


def _with_singletons(labels: Sequence[Hashable | None]) -> list[str]:
    return [
        f"\x00singleton-{i}" if label is None or label == -1 else f"label-{label}"
        for i, label in enumerate(labels)
    ]


def _silhouette(
    labels: Sequence[Hashable | None], embeddings: np.ndarray, seed: int
) -> float | None:
    from sklearn.metrics import silhouette_score

    assigned = np.array([i for i, label in enumerate(labels) if label is not None and label != -1])
    if len(assigned) < 3:
        return None
    kept = [str(labels[i]) for i in assigned]
    n_clusters = len(set(kept))
    if not 2 <= n_clusters <= len(assigned) - 1:
        return None
    sample = min(len(assigned), SILHOUETTE_SAMPLE)
    return float(
        silhouette_score(
            embeddings[assigned], kept, metric="cosine", sample_size=sample, random_state=seed
        )
    )


def template_quality(
    labels_true: Sequence[Hashable | None] | None,
    labels_pred: Sequence[Hashable | None],
    embeddings: np.ndarray | None,
    seed: int = 0,
) -> dict[str, Any]:
    """ARI and NMI (with `labels_true`), coverage, silhouette (with `embeddings`).

    Args:
        labels_true: ground-truth template per prompt (None or -1: a one-off), or None.
        labels_pred: mined template per prompt (None or -1: unassigned).
        embeddings: (N, D) prompt embeddings for the silhouette, or None to skip it.
        seed: the silhouette's sampling seed.

    Returns:
        {"n", "clusters", "coverage", "silhouette", and "ari", "nmi" when labels are given}.
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    n = len(labels_pred)
    if n == 0:
        raise ValueError("no predictions to score")
    if labels_true is not None and len(labels_true) != n:
        raise ValueError(f"{len(labels_true)} true labels for {n} predictions")
    if embeddings is not None and len(embeddings) != n:
        raise ValueError(f"{len(embeddings)} embeddings for {n} predictions")
    assigned = [label for label in labels_pred if label is not None and label != -1]
    out: dict[str, Any] = {
        "n": n,
        "clusters": len(set(assigned)),
        "coverage": len(assigned) / n,
        "silhouette": None if embeddings is None else _silhouette(labels_pred, embeddings, seed),
    }
    if labels_true is not None:
        truth, pred = _with_singletons(labels_true), _with_singletons(labels_pred)
        out["ari"] = float(adjusted_rand_score(truth, pred))
        out["nmi"] = float(normalized_mutual_info_score(truth, pred))
    return out

"""Density clustering of the candidate constants' embeddings, along the structure tree.

Each node of the constant tree is a point: the embedding of its constant text, weighted by the
distinct prompts whose shared opening stops there. Two nodes are neighbours only when one is the
other's parent in the tree and their embeddings are within `eps` (cosine distance): extending
"Summarise this filing for a credit analyst:" by a filler's first words ("who", "how many") barely
moves the embedding (cosine 0.88-0.99 measured with MiniLM), extending "I want you to act as a" by a
role ("Linux Terminal.") moves it far (0.37). Weighted DBSCAN (eps 0.35, min_samples 5 by default)
then merges the over-shoots into their template and keeps the roles apart.

Measured on the templated development workload (3,000 prompts, seed 0, ARI with one-offs as
singletons; `benchmarks/templates.py`): DBSCAN on the tree 1.0 (0.9998-1.0 over three seeds);
HDBSCAN on the tree's bottleneck distances 0.9999 (0.993-0.9997 in earlier iterations), slower
(it needs the points expanded per prompt, an N x N matrix: 9.5 s against 6.3 s) and capped at
`HDBSCAN_MAX_POINTS`, for no gain, so DBSCAN with the seed's eps stays the default; DBSCAN over all
pairs of constants ("flat") the same here, because the checks of `accept.py` split its
cross-template merges again: kept as an option, not the default, since the tree only ever
compares a constant with its own extensions, which is the question asked; no embeddings at all
("structure") 0.26, every over-shoot its own template. Whole prompts instead of constants:
DBSCAN (eps 0.35) 0.18, HDBSCAN 0.25.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import sparse

from models.templates.structure import ConstantNode

METHODS = ("dbscan", "hdbscan", "flat", "structure")
HDBSCAN_MAX_POINTS = 6_000


def _weights(nodes: Sequence[ConstantNode]) -> np.ndarray:
    return np.array([len(node.members) for node in nodes], dtype=np.float64)


def _tree_graph(
    nodes: Sequence[ConstantNode], vectors: np.ndarray, eps: float
) -> sparse.csr_matrix:
    rows, cols, dists = [], [], []
    for child, node in enumerate(nodes):
        if node.parent is None:
            continue
        # Clipped above zero: a stored zero would read as "no edge" in a sparse graph.
        d = max(1.0 - float(vectors[child] @ vectors[node.parent]), 1e-9)
        if d <= eps:
            rows += [child, node.parent]
            cols += [node.parent, child]
            dists += [d, d]
    n = len(nodes)
    return sparse.csr_matrix((dists, (rows, cols)), shape=(n, n))


def _labels_to_groups(labels: np.ndarray) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        if label >= 0:
            groups.setdefault(int(label), []).append(i)
    return list(groups.values())


def cluster_nodes(
    nodes: Sequence[ConstantNode],
    vectors: np.ndarray | None,
    eps: float,
    min_support: int,
    method: str = "dbscan",
) -> list[list[int]]:
    """Groups of node indices, each one candidate template (noise nodes are left out).

    Args:
        nodes: the constant tree.
        vectors: (len(nodes), D) unit embeddings of the nodes' constant texts (unused by
            "structure").
        eps: DBSCAN's cosine-distance radius (HDBSCAN chooses its own density levels; its
            cluster_selection_epsilon fails on precomputed distances in scikit-learn 1.9).
        min_support: DBSCAN's min_samples / HDBSCAN's min_cluster_size, counted in prompts.
        method: one of `METHODS`.
    """
    if method not in METHODS:
        raise ValueError(f"unknown clustering method {method!r}; choose from {METHODS}")
    if not nodes:
        return []
    if method == "structure":
        return [[i] for i, node in enumerate(nodes) if len(node.members) >= min_support]
    assert vectors is not None
    from sklearn.cluster import DBSCAN

    weights = _weights(nodes)
    if method == "dbscan":
        graph = _tree_graph(nodes, vectors, eps)
        model = DBSCAN(eps=eps, min_samples=min_support, metric="precomputed")
        return _labels_to_groups(model.fit(graph, sample_weight=weights).labels_)
    if method == "flat":
        model = DBSCAN(eps=eps, min_samples=min_support, metric="cosine", algorithm="brute")
        return _labels_to_groups(model.fit(vectors, sample_weight=weights).labels_)
    return _hdbscan(nodes, vectors, min_support)


def _bottleneck(nodes: Sequence[ConstantNode], vectors: np.ndarray) -> np.ndarray:
    """(n, n) the largest edge distance on the tree path between two nodes (1 across trees)."""
    n = len(nodes)
    neighbours: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for child, node in enumerate(nodes):
        if node.parent is not None:
            d = float(np.clip(1.0 - vectors[child] @ vectors[node.parent], 0.0, 1.0))
            neighbours[child].append((node.parent, d))
            neighbours[node.parent].append((child, d))
    out = np.ones((n, n))
    for source in range(n):
        reach = {source: 0.0}
        stack = [source]
        while stack:  # a tree: every node is reached once, by its only path
            here = stack.pop()
            for there, d in neighbours[here]:
                if there not in reach:
                    reach[there] = max(reach[here], d)
                    stack.append(there)
        for there, bottleneck in reach.items():
            out[source, there] = bottleneck
    return out


def _hdbscan(
    nodes: Sequence[ConstantNode], vectors: np.ndarray, min_support: int
) -> list[list[int]]:
    from sklearn.cluster import HDBSCAN

    point_node = np.array([i for i, node in enumerate(nodes) for _ in node.members])
    if len(point_node) > HDBSCAN_MAX_POINTS:
        raise ValueError(
            f"hdbscan needs an (N, N) matrix: {len(point_node)} prompts > {HDBSCAN_MAX_POINTS}"
        )
    if len(point_node) < max(min_support, 2):
        return []
    per_node = _bottleneck(nodes, vectors)
    distances = per_node[np.ix_(point_node, point_node)]
    model = HDBSCAN(
        min_cluster_size=min_support,
        metric="precomputed",
        allow_single_cluster=True,
        copy=True,
    )
    labels = model.fit(distances).labels_
    groups: dict[int, set[int]] = {}
    for node, label in zip(point_node, labels, strict=True):
        if label >= 0:
            groups.setdefault(int(label), set()).add(int(node))
    return [sorted(group) for group in groups.values()]

"""Cross-session intents: sessions clustered by what they asked for, across tenants.

A session's top-3 intents are its 3 most frequent nodes (templates or frequent phrases: the
hotspot graph's nodes, `hotspot.node_keys`), ties broken by recency (the later last request
first). Its vector is the unit mean of those nodes' centroid embeddings, unweighted: an intent
counts once however often it was repeated, so a session that asked one thing ten times and two
others once is still about three things. DBSCAN (cosine, eps 0.35, min_samples 5, the template
miner's defaults) then runs across all sessions of all tenants. Sessions with the same intents
have the same vector, so DBSCAN runs on the distinct vectors weighted by how many sessions share
each (`sample_weight`): the same clusters, a fraction of the distances.

The report: `coverage` (share of sessions in a cluster), `silhouette` (cosine, over clustered
sessions, a seeded sample of at most `silhouette_sample`; None with fewer than 2 clusters), and
per cluster three entropies in bits, summarised as size-weighted means:

- `session_id_entropy`: the issue's literal "entropy of session ids within a cluster". Session
  ids are unique, so it is log2(size): it measures a cluster's size, not its purity (kept so the
  literal definition is on record, and it is below log2(size) only if ids repeat across tenants).
- `intent_entropy`: entropy of the sessions' dominant intent (their top-1 (tenant, node)): 0 when
  a cluster is one intent, the purity a reader means. It is at least `tenant_entropy`, since the
  tenant is part of the intent.
- `tenant_entropy`: entropy of the sessions' tenants: 0 when an intent is one tenant's, high when
  tenants share it (a cluster is analytics; it never makes a cache key cross tenants).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from models.templates.hotspot import (
    HotspotConfig,
    HotspotGraph,
    NodeVectors,
    build_hotspot_graph,
    keyed_rows,
    node_keys,
    node_vectors,
)


@dataclass(frozen=True)
class IntentConfig:
    """top: intents per session; eps, min_samples: DBSCAN's; silhouette_sample, seed: its
    sample of clustered sessions (0: no silhouette)."""

    top: int = 3
    eps: float = 0.35
    min_samples: int = 5
    silhouette_sample: int = 2_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.top < 1 or self.min_samples < 1 or self.silhouette_sample < 0:
            raise ValueError("top and min_samples must be >= 1, silhouette_sample >= 0")
        if not 0.0 < self.eps < 1.0:
            raise ValueError("eps is a cosine distance in (0, 1)")


@dataclass
class SessionIntents:
    """One row per session with an intent: tenant, session_id, intents (top nodes, most
    frequent first), dominant (the first); `vectors` (S, D) are their unit mean embeddings."""

    sessions: pd.DataFrame
    vectors: np.ndarray


def session_intents(rows: pd.DataFrame, vectors: NodeVectors, top: int = 3) -> SessionIntents:
    """Each session's top `top` nodes and their mean-pooled unit vector.

    Raises:
        ValueError: a missing column or a node without a vector. NoSessionNodes: no row has a
            node.
    """
    frame = keyed_rows(rows)
    counted = frame.groupby(["tenant", "session_id", "node"], sort=False).agg(
        n=("timestamp", "size"), last=("timestamp", "max")
    )
    counted = counted.reset_index().sort_values(
        ["tenant", "session_id", "n", "last", "node"],
        ascending=[True, True, False, False, True],
        kind="stable",
    )
    chosen = counted.groupby(["tenant", "session_id"], sort=False).head(top)
    per_session = chosen.groupby(["tenant", "session_id"], sort=False)["node"].agg(tuple)
    sessions = per_session.rename("intents").reset_index()
    sessions["dominant"] = [intents[0] for intents in sessions["intents"]]
    pooled = np.empty((len(sessions), _dimensions(vectors)), dtype=np.float64)  # (S, D)
    for i, (tenant, intents) in enumerate(
        zip(sessions["tenant"], sessions["intents"], strict=True)
    ):
        absent = [n for n in intents if (tenant, n) not in vectors]
        if absent:
            raise ValueError(f"no vector for node {absent[0]!r} of tenant {tenant!r}")
        mean = np.mean([vectors[tenant, n] for n in intents], axis=0)  # (D,)
        pooled[i] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return SessionIntents(sessions, pooled)


def _dimensions(vectors: NodeVectors) -> int:
    for vector in vectors.values():
        return int(np.shape(vector)[0])
    raise ValueError("no node vectors")


@dataclass
class IntentReport:
    """What `cluster_intents` measured; `labels` (S,) per session of `SessionIntents`, -1 noise."""

    n_sessions: int
    clusters: int
    coverage: float
    silhouette: float | None
    session_id_entropy: float | None
    intent_entropy: float | None
    tenant_entropy: float | None
    per_cluster: list[dict[str, Any]] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    params: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The numbers an MLflow run charts (prefixed `intents.`; a None is left out)."""
        names = ("n_sessions", "clusters", "coverage", "silhouette", "session_id_entropy")
        names += ("intent_entropy", "tenant_entropy")
        values = {f"intents.{n}": getattr(self, n) for n in names}
        return {k: float(v) for k, v in values.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            **{k: v for k, v in vars(self).items() if k not in ("labels", "params")},
        }


def entropy_bits(values: Sequence[Hashable]) -> float:
    """Shannon entropy of the values' empirical distribution, in bits (0 for one distinct)."""
    counts = np.array(list(Counter(values).values()), dtype=np.float64)
    if counts.size <= 1:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def cluster_intents(intents: SessionIntents, config: IntentConfig | None = None) -> IntentReport:
    """DBSCAN over the sessions' vectors and the report (see the module docstring)."""
    from sklearn.cluster import DBSCAN

    config = config or IntentConfig()
    sessions, vectors = intents.sessions, intents.vectors
    if len(sessions) == 0:
        raise ValueError("no sessions to cluster")
    distinct, inverse, weight = np.unique(vectors, axis=0, return_inverse=True, return_counts=True)
    model = DBSCAN(eps=config.eps, min_samples=config.min_samples, metric="cosine")
    labels = model.fit(distinct, sample_weight=weight).labels_[inverse.reshape(-1)]  # (S,)
    clustered = labels >= 0
    per_cluster = [
        _cluster_summary(int(label), sessions[labels == label])
        for label in sorted(set(labels[clustered].tolist()))
    ]
    means = {
        name: _weighted_mean(per_cluster, name)
        for name in ("session_id_entropy", "intent_entropy", "tenant_entropy")
    }
    return IntentReport(
        n_sessions=len(sessions),
        clusters=len(per_cluster),
        coverage=float(clustered.mean()),
        silhouette=_silhouette(vectors[clustered], labels[clustered], config),
        per_cluster=per_cluster,
        labels=labels,
        params={"top": config.top, "eps": config.eps, "min_samples": config.min_samples},
        **means,
    )


def _cluster_summary(label: int, members: pd.DataFrame) -> dict[str, Any]:
    dominant = list(zip(members["tenant"], members["dominant"], strict=True))
    return {
        "cluster": label,
        "size": len(members),
        "session_id_entropy": entropy_bits(members["session_id"].tolist()),
        "intent_entropy": entropy_bits(dominant),
        "tenant_entropy": entropy_bits(members["tenant"].tolist()),
        "tenants": dict(Counter(members["tenant"].tolist()).most_common()),
        "top_intents": [
            {"tenant": t, "node": n, "sessions": c}
            for (t, n), c in Counter(dominant).most_common(3)
        ],
    }


def _weighted_mean(per_cluster: list[dict[str, Any]], name: str) -> float | None:
    total = sum(c["size"] for c in per_cluster)
    return sum(c[name] * c["size"] for c in per_cluster) / total if total else None


def _silhouette(vectors: np.ndarray, labels: np.ndarray, config: IntentConfig) -> float | None:
    """Cosine silhouette of the clustered sessions (vectors (C, D)), on a seeded sample."""
    from sklearn.metrics import silhouette_score

    if config.silhouette_sample == 0 or len(set(labels.tolist())) < 2:
        return None
    if len(labels) > config.silhouette_sample:
        rng = np.random.default_rng(config.seed)
        keep = np.sort(rng.choice(len(labels), size=config.silhouette_sample, replace=False))
        vectors, labels = vectors[keep], labels[keep]
    if not 2 <= len(set(labels.tolist())) < len(labels):  # silhouette's own precondition
        return None
    score = float(silhouette_score(vectors, labels, metric="cosine"))
    return score if math.isfinite(score) else None


def intent_clusters(
    rows: pd.DataFrame, vectors: NodeVectors, config: IntentConfig | None = None
) -> IntentReport:
    """`session_intents` then `cluster_intents`: the report of the flow's rows."""
    config = config or IntentConfig()
    return cluster_intents(session_intents(rows, vectors, config.top), config)


@dataclass
class SessionAnalysis:
    """A mining's session views: the hotspot graph, the intent report and the files written."""

    graph: HotspotGraph
    report: IntentReport
    paths: dict[str, Path]

    def summary(self) -> dict[str, Any]:
        """Counts and metrics for the flow's result (the files hold the rest)."""
        report = self.report.to_dict()
        return {
            "nodes": len(self.graph.nodes),
            "edges": len(self.graph.edges),
            **{k: v for k, v in report.items() if k not in ("params", "per_cluster")},
            "paths": {name: str(path) for name, path in self.paths.items()},
        }


def analyse_sessions(
    requests: pd.DataFrame,
    templates: pd.DataFrame,
    out_dir: Path,
    embed: Callable[[list[str]], np.ndarray],
    graph_config: HotspotConfig | None = None,
    intent_config: IntentConfig | None = None,
    max_requests: int = 50_000,
) -> SessionAnalysis:
    """Graph and intents of each tenant's latest `max_requests` requests, written to `out_dir`
    as `graph.json`, `graph.png` and `intents.json`.

    Args:
        requests: tenant, session_id, timestamp, template_id, prompt (RequestLog columns).
        templates: the mined `TemplateTable`: prompts the log gave no template id get theirs.
        embed: texts -> (N, D) unit embeddings (the nodes' centroids come from their prompts;
            a node without any prompt is left out of both views).

    Raises:
        ValueError: a missing column. NoSessionNodes: no request has a node.
    """
    from models.templates.mined import MinedTemplates

    graph_config = graph_config or HotspotConfig()
    latest = requests.sort_values("timestamp", kind="stable").groupby("tenant").tail(max_requests)
    latest = latest.reset_index(drop=True)
    assigners = {
        str(tenant): MinedTemplates.from_frame(rows).assign
        for tenant, rows in templates.groupby("tenant", observed=True)
    }

    def mined(tenant: str, prompt: str) -> str | None:
        assign = assigners.get(tenant)
        return assign(prompt) if assign is not None else None

    rows = latest.assign(node=node_keys(latest, graph_config, mined))
    vectors = node_vectors(rows, embed)
    # A node none of whose requests carries a prompt (ids-only logs) has no meaning to place.
    placed = [k in vectors for k in zip(rows["tenant"].astype(str), rows["node"], strict=True)]
    rows = rows.assign(node=rows["node"].where(placed))
    graph = build_hotspot_graph(rows, vectors, graph_config)
    report = intent_clusters(rows, vectors, intent_config)
    out_dir = Path(out_dir)
    paths = {
        "graph_json": graph.to_json(out_dir / "graph.json"),
        "graph_png": graph.draw(out_dir / "graph.png"),
        "intents_json": out_dir / "intents.json",
    }
    paths["intents_json"].write_text(json.dumps(report.to_dict(), indent=1), encoding="utf-8")
    return SessionAnalysis(graph, report, paths)

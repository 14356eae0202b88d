"""Cross-session intents: top-3 per session, DBSCAN over sessions, the report's numbers against
hand-computed ones, known groups recovered, bad input; `analyse_sessions` writes its files.

Embeddings are hand-made unit vectors; MiniLM runs in the flow test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import adjusted_rand_score

from data_contracts.templates import empty_templates
from models.templates.hotspot import HotspotGraph, NoSessionNodes
from models.templates.intents import (
    IntentConfig,
    SessionIntents,
    analyse_sessions,
    cluster_intents,
    entropy_bits,
    intent_clusters,
    session_intents,
)

T0 = pd.Timestamp("2024-03-04T09:00:00Z")
U = np.array([1.0, 0.0, 0.0])
V = np.array([0.8, 0.6, 0.0])  # cosine distance to U: 0.2 (inside eps 0.35)
W = np.array([0.0, 0.0, 1.0])  # distance 1 to both
Z = np.array([0.0, 1.0, 0.0])  # distance 0.4 to V, 1 to U and W: noise


def rows_of(sessions: list[tuple[str, str, list[str]]]) -> pd.DataFrame:
    """(tenant, session id, nodes in time order) -> graph rows, one request a second."""
    out = []
    for tenant, session, nodes in sessions:
        for i, node in enumerate(nodes):
            stamp = T0 + pd.Timedelta(seconds=i)
            out.append({"tenant": tenant, "session_id": session, "timestamp": stamp, "node": node})
    return pd.DataFrame(out)


# Cluster A: u in tenants a and b (b reuses the session id "s1"), one v; cluster B: 5 x w;
# one session on z alone: noise.
TINY = rows_of(
    [("a", "s1", ["u"]), ("a", "s2", ["u"]), ("b", "s1", ["u"]), ("b", "s4", ["u"]),
     ("a", "s5", ["v"])]
    + [("b", f"w{i}", ["w", "w"]) for i in range(5)]
    + [("a", "z", ["z"])]
)  # fmt: skip
TINY_VECTORS = {("a", "u"): U, ("b", "u"): U, ("a", "v"): V, ("b", "w"): W, ("a", "z"): Z}


def h(*p: float) -> float:
    return -sum(x * math.log2(x) for x in p)


def test_the_report_matches_hand_computed_numbers() -> None:
    report = intent_clusters(TINY, TINY_VECTORS)
    assert (report.n_sessions, report.clusters) == (11, 2)
    assert report.coverage == pytest.approx(10 / 11)
    # Silhouette (cosine): the 4 u sessions a = 0.2 / 4, b = 1 -> 0.95; v: a = 0.2, b = 1 ->
    # 0.8; the 5 w sessions a = 0, b = 1 -> 1.
    assert report.silhouette == pytest.approx((4 * 0.95 + 0.8 + 5 * 1.0) / 10)
    a, b = sorted(report.per_cluster, key=lambda c: c["tenant_entropy"], reverse=True)
    assert (a["size"], b["size"]) == (5, 5)
    # Literal: ids s1, s2, s1, s4, s5 (s1 in both tenants) -> below log2(5); B's are unique.
    assert a["session_id_entropy"] == pytest.approx(h(0.4, 0.2, 0.2, 0.2))
    assert b["session_id_entropy"] == pytest.approx(math.log2(5))
    # Dominant intents (a,u) x2, (b,u) x2, (a,v); tenants a x3, b x2. B is one intent.
    assert a["intent_entropy"] == pytest.approx(h(0.4, 0.4, 0.2))
    assert a["tenant_entropy"] == pytest.approx(h(0.6, 0.4))
    assert (b["intent_entropy"], b["tenant_entropy"]) == (0.0, 0.0)
    assert report.intent_entropy == pytest.approx(h(0.4, 0.4, 0.2) / 2)
    assert report.tenant_entropy == pytest.approx(h(0.6, 0.4) / 2)
    assert report.session_id_entropy == pytest.approx((h(0.4, 0.2, 0.2, 0.2) + math.log2(5)) / 2)
    assert b["top_intents"] == [{"tenant": "b", "node": "w", "sessions": 5}]
    assert report.labels.tolist().count(-1) == 1
    assert report.metrics()["intents.coverage"] == pytest.approx(10 / 11)
    json.dumps(report.to_dict())  # the flow writes it as is


def test_one_cluster_has_no_silhouette_and_sampling_is_seeded() -> None:
    report = intent_clusters(TINY[TINY["node"] == "w"], TINY_VECTORS)
    assert report.clusters == 1 and report.silhouette is None
    assert "intents.silhouette" not in report.metrics()
    sampled = [
        intent_clusters(TINY, TINY_VECTORS, IntentConfig(silhouette_sample=8, seed=s)).silhouette
        for s in (1, 1)
    ]
    assert sampled[0] == sampled[1] is not None


def test_top_intents_are_the_most_frequent_ties_by_recency() -> None:
    vectors = {("t", n): v for n, v in zip("xyzq", np.eye(4), strict=True)}
    # x 3 times, y twice, z and q once each, q later than z: the top 3 are x, y, q.
    intents = session_intents(rows_of([("t", "s", list("xyzxyxq"))]), vectors)
    assert intents.sessions["intents"].tolist() == [("x", "y", "q")]
    assert intents.sessions["dominant"].tolist() == ["x"]
    np.testing.assert_allclose(intents.vectors[0], [1, 1, 0, 1] / np.sqrt(3))  # (D,)


def test_sessions_from_known_intent_groups_cluster_into_them() -> None:
    rng = np.random.default_rng(0)
    groups, dims = 4, 32
    centres = rng.normal(size=(groups, dims))  # (G, D)
    vectors = {}
    for g in range(groups):
        for n in range(4):
            v = centres[g] / np.linalg.norm(centres[g]) + 0.1 * rng.normal(size=dims) / np.sqrt(
                dims
            )
            vectors["acme", f"g{g}n{n}"] = v / np.linalg.norm(v)
    sessions, truth = [], []
    for s in range(80):
        g = s % groups
        picked = rng.choice(4, size=int(rng.integers(1, 6)), replace=True)
        sessions.append(("acme", f"s{s}", [f"g{g}n{n}" for n in picked]))
        truth.append(g)
    for s in range(3):  # sessions on one-off intents, far from every group
        v = rng.normal(size=dims)
        vectors["acme", f"odd{s}"] = v / np.linalg.norm(v)
        sessions.append(("acme", f"odd{s}", [f"odd{s}"]))
        truth.append(-1 - s)
    intents = session_intents(rows_of(sessions), vectors)
    report = cluster_intents(intents)
    order = {s: i for i, (_, s, _) in enumerate(sessions)}
    labels = np.empty(len(sessions), dtype=int)
    labels[[order[s] for s in intents.sessions["session_id"]]] = report.labels
    assert report.clusters == groups and report.coverage == pytest.approx(80 / 83)
    assert adjusted_rand_score(truth[:80], labels[:80]) == 1.0 and (labels[80:] == -1).all()
    assert report.silhouette is not None and report.silhouette > 0.8
    assert report.tenant_entropy == 0.0


def test_bad_input_fails_clearly() -> None:
    with pytest.raises(ValueError, match=r"missing column\(s\) timestamp"):
        intent_clusters(TINY.drop(columns="timestamp"), TINY_VECTORS)
    with pytest.raises(NoSessionNodes):
        intent_clusters(TINY.iloc[:0], TINY_VECTORS)
    with pytest.raises(ValueError, match="no vector for node 'z' of tenant 'a'"):
        intent_clusters(TINY, {k: v for k, v in TINY_VECTORS.items() if k[1] != "z"})
    with pytest.raises(ValueError, match="no sessions to cluster"):
        cluster_intents(SessionIntents(TINY.iloc[:0], np.empty((0, 3))))
    with pytest.raises(ValueError, match="eps is a cosine distance"):
        IntentConfig(eps=1.5)
    assert entropy_bits(["x"] * 4) == 0.0 and entropy_bits("abcd") == pytest.approx(2.0)


def test_analyse_sessions_writes_graph_png_and_intents(tmp_path: Path) -> None:
    topics = {"rates": [1.0, 0.0], "cards": [0.0, 1.0]}

    def embed(texts: list[str]) -> np.ndarray:  # (N, 2): by the prompt's first word
        return np.array([topics[t.split()[0]] for t in texts])

    requests = pd.DataFrame(
        [
            {"tenant": "acme", "session_id": f"s{s}", "timestamp": T0 + pd.Timedelta(seconds=i),
             "template_id": "r" if i == 0 else None,
             "prompt": f"rates question {s}" if i == 0 else f"cards limit for client {s}"}
            for s in range(6) for i in range(2)
        ]
    )  # fmt: skip
    ids_only = {"tenant": "acme", "session_id": "s0", "timestamp": T0, "template_id": "q"}
    requests = pd.concat([requests, pd.DataFrame([{**ids_only, "prompt": None}])])
    analysis = analyse_sessions(requests, empty_templates(), tmp_path / "hotspot", embed)
    graph = HotspotGraph.from_json(analysis.paths["graph_json"])
    assert graph.follows("acme", "template:r") == [("phrase:cards limit for client #", 1.0)]
    assert analysis.paths["graph_png"].read_bytes().startswith(b"\x89PNG")
    saved = json.loads(analysis.paths["intents_json"].read_text())
    assert saved["n_sessions"] == 6 and saved["clusters"] == 1 and saved["coverage"] == 1.0
    # "q" has no prompt to embed: left out, not an error.
    assert analysis.summary()["nodes"] == 2 and analysis.summary()["edges"] == 1

"""The hotspot graph: exact weights (decay x similarity), tenant isolation, node keys, bad input,
the JSON round trip, the PNG, and the planner's optional successor boost.

Embeddings are hand-made unit vectors (cosines known exactly); MiniLM runs in the flow test.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pandera.errors
import pytest

from models.templates.hotspot import (
    HotspotConfig,
    HotspotGraph,
    NoSessionNodes,
    build_hotspot_graph,
    node_keys,
    node_vectors,
    phrase_key,
)

T0 = pd.Timestamp("2024-03-04T09:00:00Z")
U = np.array([1.0, 0.0, 0.0])  # a
V = np.array([0.0, 1.0, 0.0])  # cos(a, b) = 0   -> (1 + 0) / 2   = 0.5
W = np.array([0.6, 0.8, 0.0])  # cos(a, c) = 0.6 -> (1 + 0.6) / 2 = 0.8
VECTORS = {("acme", "template:a"): U, ("acme", "template:b"): V, ("acme", "template:c"): W}


def log(*requests: tuple[str, str, float, str]) -> pd.DataFrame:
    """(tenant, session, seconds after T0, node) -> graph rows, in a shuffled order."""
    frame = pd.DataFrame(
        [
            {"tenant": t, "session_id": s, "timestamp": T0 + pd.Timedelta(seconds=x), "node": n}
            for t, s, x, n in requests
        ]
    )
    return frame.sample(frac=1.0, random_state=3).reset_index(drop=True)


def edge(graph: HotspotGraph, source: str, target: str, tenant: str = "acme") -> pd.Series:
    e = graph.edges
    found = e[(e["tenant"] == tenant) & (e["source"] == source) & (e["target"] == target)]
    assert len(found) == 1, graph.edges
    return found.iloc[0]


# The hand-built log: a -> b twice (old), a -> c once (recent), one pair past the gap.
HAND = log(
    ("acme", "s1", 0, "template:a"), ("acme", "s1", 10, "template:b"),
    ("acme", "s2", 20, "template:a"), ("acme", "s2", 30, "template:b"),
    ("acme", "s3", 280, "template:a"), ("acme", "s3", 290, "template:c"),
    ("acme", "s4", 100, "template:c"), ("acme", "s4", 300, "template:b"),  # 200 s > max gap
)  # fmt: skip
CONFIG = HotspotConfig(half_life_s=100.0, max_gap_s=60.0, min_support=1)


def test_weight_is_similarity_times_decayed_transitions() -> None:
    graph = build_hotspot_graph(HAND, VECTORS, CONFIG)
    # now = the latest request (300 s); a transition's age is its target's.
    decay_b = 2 ** (-(300 - 10) / 100) + 2 ** (-(300 - 30) / 100)
    decay_c = 2 ** (-(300 - 290) / 100)
    ab, ac = edge(graph, "template:a", "template:b"), edge(graph, "template:a", "template:c")
    assert (ab["transitions"], ac["transitions"]) == (2, 1)
    assert ab["decayed"] == pytest.approx(decay_b) and ac["decayed"] == pytest.approx(decay_c)
    assert (ab["similarity"], ac["similarity"]) == pytest.approx((0.5, 0.8))
    assert ab["weight"] == pytest.approx(0.5 * decay_b)
    p_c = 0.8 * decay_c / (0.8 * decay_c + 0.5 * decay_b)
    assert ac["probability"] == pytest.approx(p_c)
    # Twice as many a -> b, but a -> c is recent and closer in meaning: c usually follows a.
    assert graph.follows("acme", "template:a") == [
        ("template:c", pytest.approx(p_c)),
        ("template:b", pytest.approx(1 - p_c)),
    ]
    assert graph.follows("acme", "template:a", k=1)[0][0] == "template:c"
    # c -> b came 200 s later: past the 60 s gap, so c has no successor.
    assert graph.follows("acme", "template:c") == [] and len(graph.edges) == 2
    assert graph.nodes.set_index("node")["volume"].to_dict() == {
        "template:a": 3, "template:b": 3, "template:c": 2,
    }  # fmt: skip


def test_decay_alone_and_similarity_alone_decide() -> None:
    # No decay to speak of (a half-life of years): the counts and similarity decide, b's two
    # transitions at 0.5 beat c's one at 0.8.
    slow = build_hotspot_graph(HAND, VECTORS, HotspotConfig(half_life_s=1e12, max_gap_s=60.0))
    assert slow.follows("acme", "template:a")[0] == ("template:b", pytest.approx(1.0 / 1.8))
    # "positive" similarity: cos(a, b) = 0 drops a -> b, c follows a for sure.
    positive = build_hotspot_graph(
        HAND, VECTORS, HotspotConfig(half_life_s=100.0, max_gap_s=60.0, similarity="positive")
    )
    assert positive.follows("acme", "template:a") == [("template:c", 1.0)]
    assert edge(positive, "template:a", "template:c")["similarity"] == pytest.approx(0.6)


def test_an_older_now_decays_less_and_self_loops_are_optional() -> None:
    repeat = log(("acme", "s1", 0, "template:a"), ("acme", "s1", 30, "template:a"))
    graph = build_hotspot_graph(repeat, VECTORS, CONFIG, now=T0 + pd.Timedelta(seconds=130))
    loop = edge(graph, "template:a", "template:a")
    assert loop["decayed"] == pytest.approx(0.5) and loop["similarity"] == pytest.approx(1.0)
    assert graph.follows("acme", "template:a") == [("template:a", 1.0)]
    no_loops = HotspotConfig(half_life_s=100.0, max_gap_s=60.0, self_loops=False)
    alone = build_hotspot_graph(repeat, VECTORS, no_loops)
    assert alone.edges.empty and HotspotGraph.from_dict(alone.to_dict()).edges.empty


def test_sessions_never_join_across_tenants() -> None:
    # Same session id, interleaved in time: by time alone a -> x -> b -> y would be one chain.
    rows = log(
        ("acme", "s1", 0, "template:a"), ("globex", "s1", 5, "template:x"),
        ("acme", "s1", 10, "template:b"), ("globex", "s1", 15, "template:y"),
    )  # fmt: skip
    vectors = {**VECTORS, ("globex", "template:x"): U, ("globex", "template:y"): W}
    graph = build_hotspot_graph(rows, vectors, CONFIG)
    pairs = set(graph.edges[["tenant", "source", "target"]].itertuples(index=False, name=None))
    assert pairs == {("acme", "template:a", "template:b"), ("globex", "template:x", "template:y")}
    assert graph.follows("globex", "template:a") == []  # acme's node is not globex's
    assert set(graph.nodes[["tenant", "node"]].itertuples(index=False, name=None)) == {
        ("acme", "template:a"), ("acme", "template:b"),
        ("globex", "template:x"), ("globex", "template:y"),
    }  # fmt: skip


def test_bad_input_fails_clearly() -> None:
    with pytest.raises(ValueError, match=r"missing column\(s\) session_id"):
        build_hotspot_graph(HAND.drop(columns="session_id"), VECTORS)
    with pytest.raises(NoSessionNodes, match="no request has a node"):
        build_hotspot_graph(HAND.iloc[:0], VECTORS)
    with pytest.raises(NoSessionNodes):
        build_hotspot_graph(HAND.assign(node=pd.NA), VECTORS)
    with pytest.raises(ValueError, match="no vector for node 'template:c' of tenant 'acme'"):
        build_hotspot_graph(HAND, {k: v for k, v in VECTORS.items() if k[1] != "template:c"})
    with pytest.raises(ValueError, match=r"missing column\(s\) template_id"):
        node_keys(pd.DataFrame({"tenant": ["a"], "prompt": ["hi"]}))
    with pytest.raises(ValueError, match="similarity 'cosine'"):
        HotspotConfig(similarity="cosine")
    with pytest.raises(ValueError, match="must be positive"):
        HotspotConfig(half_life_s=0)


def test_node_keys_prefer_the_logs_template_then_mined_then_a_frequent_phrase() -> None:
    requests = pd.DataFrame(
        {
            "tenant": ["acme"] * 6 + ["globex"],
            "template_id": ["t1", None, None, None, None, None, None],
            "prompt": [
                "Summarise this", "Summarise this filing: x", "What is the 10-K of ACME?",
                "what is the 10 k of acme", "What is the 7-K of ACME, really", "one-off", None,
            ],
        }
    )  # fmt: skip
    mined = {("acme", "Summarise this filing: x"): "m9"}
    keys = node_keys(requests, HotspotConfig(min_support=3, phrase_words=6),
                     lambda tenant, prompt: mined.get((tenant, prompt)))  # fmt: skip
    assert keys.tolist()[:5] == [
        "template:t1", "mined:m9", "phrase:what is the # k of", "phrase:what is the # k of",
        "phrase:what is the # k of",
    ]  # fmt: skip
    assert pd.isna(keys.iloc[5]) and pd.isna(keys.iloc[6])  # under min support; no prompt
    assert phrase_key("  ?! ") is None and phrase_key("A B C", words=2) == "phrase:a b"


def test_node_vectors_are_unit_centroids_of_the_commonest_prompts() -> None:
    table = {"x": [1.0, 0.0], "y": [0.0, 2.0], "z": [-1.0, 0.0]}
    seen: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        seen.extend(texts)
        return np.array([table[t] for t in texts])

    rows = pd.DataFrame(
        {"tenant": ["t"] * 5, "node": ["n"] * 5, "prompt": ["x", "y", "x", "y", "z"]}
    )
    vectors = node_vectors(rows, embed, per_node=2)
    assert sorted(seen) == ["x", "y"]  # z is the least common: left out
    np.testing.assert_allclose(vectors["t", "n"], [math.sqrt(0.5), math.sqrt(0.5)])


def test_json_round_trip_and_a_broken_file_is_refused(tmp_path: Path) -> None:
    graph = build_hotspot_graph(HAND, VECTORS, CONFIG)
    back = HotspotGraph.from_json(graph.to_json(tmp_path / "hotspot" / "graph.json"))
    pd.testing.assert_frame_equal(back.edges, graph.edges)
    pd.testing.assert_frame_equal(back.nodes, graph.nodes)
    assert back.params == graph.params and back.params["half_life_s"] == 100.0
    assert back.follows("acme", "template:a") == graph.follows("acme", "template:a")

    data = graph.to_dict()
    data["edges"][0]["probability"] = 0.5
    with pytest.raises(pandera.errors.SchemaErrors, match="probabilities_sum_to_one_per_source"):
        HotspotGraph.from_dict(data)
    data = graph.to_dict()
    data["nodes"] = [n for n in data["nodes"] if n["node"] != "template:c"]
    with pytest.raises(ValueError, match="target 'template:c' is not a node of that tenant"):
        HotspotGraph.from_dict(data)
    with pytest.raises(ValueError, match="not a hotspot graph"):
        HotspotGraph.from_dict({"format": "other"})


def test_png_is_written(tmp_path: Path) -> None:
    graph = build_hotspot_graph(HAND, VECTORS, CONFIG)
    path = graph.draw(tmp_path / "graph.png", top=2)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5_000


# -- the planner's successor boost -------------------------------------------------------------


def chain_graph() -> HotspotGraph:
    """a -> b 3 times, a -> a once (all now, same meaning); a has 5 requests, so c(a) = 4 / 5."""
    rows = [("acme", f"s{i}", 0, "template:a") for i in range(4)]
    rows += [("acme", f"s{i}", 10, "template:b") for i in range(3)]
    rows += [("acme", "s3", 10, "template:a"), ("acme", "s9", 10, "template:b")]
    same = {("acme", "template:a"): U, ("acme", "template:b"): U}
    return build_hotspot_graph(log(*rows), same, CONFIG)


def test_successor_boost_adds_the_follow_on_hits_of_hot_keys() -> None:
    graph = chain_graph()
    assert graph.follows("acme", "template:a") == [("template:b", 0.75), ("template:a", 0.25)]
    predictions = pd.DataFrame(
        {"tenant": ["acme", "acme", "globex"], "key": ["template:a", "template:b", "template:a"],
         "hits": [10.0, 2.0, 7.0], "source": "heat"}
    )  # fmt: skip
    boosted = graph.successor_boost(predictions, weight=0.5)
    # b += 0.5 x hits(a) 10 x c(a) 4/5 x P(b | a) 0.75; a's self-loop and globex are untouched.
    assert boosted["hits"].tolist() == pytest.approx([10.0, 2.0 + 0.5 * 10 * 0.8 * 0.75, 7.0])
    assert boosted["source"].tolist() == predictions["source"].tolist()
    assert graph.successor_boost(predictions, weight=0.0) is predictions
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
        graph.successor_boost(predictions, weight=-1.0)


def request_log() -> pd.DataFrame:
    """acme's templates a (8 requests) then b (4), on one system prompt (blocks 11, 12)."""
    from data_contracts import RequestLog

    rows = [
        {
            "timestamp": T0 + pd.Timedelta(seconds=60 * i), "tenant": "acme",
            "request_id": f"r{i}", "session_id": f"s{i}", "prompt": f"question {i}",
            "prompt_tokens": 80, "output_tokens": 50,
            "prefix_hashes": [11, 12, 21 if i < 8 else 31, 1000 + i],
            "template_id": "a" if i < 8 else "b", "route": "/v1/chat", "latency_ms": 100.0,
            "priority": 5,
        }
        for i in range(12)
    ]  # fmt: skip
    return RequestLog.validate(pd.DataFrame(rows))


def test_build_candidates_applies_the_boost_only_when_given() -> None:
    from models.warmup.plan import build_candidates

    requests = request_log()
    graph = chain_graph()
    seen: list[pd.DataFrame] = []

    def follows(predictions: pd.DataFrame) -> pd.DataFrame:
        seen.append(predictions)
        return graph.successor_boost(predictions, weight=1.0)

    plain = build_candidates(requests).set_index("item")["predicted_hits"]
    boosted = build_candidates(requests, follows=follows).set_index("item")["predicted_hits"]
    hits = seen[0].set_index("key")["hits"]
    gain = (hits["template:b"] + hits["template:a"] * 0.8 * 0.75) / hits["template:b"]
    assert boosted["kv:template:b"] == pytest.approx(plain["kv:template:b"] * gain)
    assert boosted["kv:template:a"] == pytest.approx(plain["kv:template:a"])


def test_the_planner_uses_the_mined_graph_only_when_asked(tmp_path: Path) -> None:
    from models.templates.hotspot import graph_path
    from models.warmup.plan import Budgets
    from models.warmup.prepare import PlanOptions, successor_boost

    assert successor_boost(tmp_path, 0.0) == (None, None)  # the default: off, nothing to say
    follows, said = successor_boost(tmp_path, 0.5)
    assert follows is None and said is not None and "run mine-templates" in said["off"]
    chain_graph().to_json(graph_path(tmp_path / "features"))
    follows, said = successor_boost(tmp_path, 0.5)
    assert follows is not None and said == {
        "weight": 0.5,
        "graph": str(graph_path(tmp_path / "features")),
    }
    predictions = pd.DataFrame({"tenant": ["acme"] * 2, "key": ["template:a", "template:b"],
                                "hits": [10.0, 2.0]})  # fmt: skip
    assert follows(predictions)["hits"].tolist() == pytest.approx([10.0, 2.0 + 0.5 * 10 * 0.6])
    with pytest.raises(ValueError, match="follow_boost must be a finite number >= 0"):
        PlanOptions(Budgets(1, 1, 1, compute_s=1, deadline_s=1), follow_boost=-0.1)

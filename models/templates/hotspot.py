"""The hotspot graph: per tenant, which templates (or frequent phrases) follow which in sessions.

Nodes are a tenant's templates and, for prompts no template covers, frequent phrases (the first
`phrase_words` normalised words, kept at `min_support` requests). Edge `A -> B` counts the times
B was a session's next request after A within `max_gap_s`, weighted by recency and meaning:

    w(A -> B) = sim(A, B) x sum over those transitions of 2^(-age / half_life_s)

age is from the transition (B's request) to `now` (default: the latest request), so half-life
means what it says (the issue's exp(-age / half_life) would be a time constant, not a half-life).
sim(A, B) = (1 + cos) / 2 of the nodes' centroid embeddings, clipped to [0, 1]. Rejected:
max(cos, 0): MiniLM puts unrelated texts at cos 0.04 +- 0.10 (the 2,145 pairs of the workload's
built-in questions and instructions; 40% below 0), so the clip turns noise into keeping or
deleting transitions that sessions did show; (1 + cos) / 2 deletes none and still ranks, at
equal counts, the successor closer in meaning first ("positive" is available as an option).
`follows(T, k)` is the top-k of w normalised per source: P(B | A) among what follows A.

Sessions never join across tenants: the tenant is part of every node's key. Requests without a
node (one-offs) are skipped, so B "follows" A across a one-off in between, still within the gap.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cache_runtime.heat import DEFAULT_HALF_LIFE_S
from data_contracts.hotspot import EDGE_COLUMNS, NODE_COLUMNS, validate_graph

FORMAT = "preheat.hotspot/1"
HOTSPOT_DIR = "hotspot"  # under the features dir, beside templates.parquet
GRAPH_COLUMNS: tuple[str, ...] = ("tenant", "session_id", "timestamp", "node")
NodeVectors = Mapping[tuple[str, str], np.ndarray]  # (tenant, node) -> (D,) unit vector
_WORD = re.compile(r"[a-z0-9]+")


def graph_path(features_dir: Path) -> Path:
    """Where the `mine-templates` flow writes the graph (the PNG and intents.json beside it)."""
    return Path(features_dir) / HOTSPOT_DIR / "graph.json"


class NoSessionNodes(ValueError):
    """No request has a node (no template id, no frequent phrase): no graph, no intents."""


@dataclass(frozen=True)
class HotspotConfig:
    """Knobs of the graph.

    Attributes:
        half_life_s: a transition this old counts half (the SSD tier's heat half-life).
        max_gap_s: B follows A only if it came within this many seconds (a session's pause).
        min_support: requests a phrase needs to be a node (templates are frequent by mining).
        phrase_words: the normalised words that make a phrase.
        similarity: "affine" ((1 + cos) / 2) or "positive" (max(cos, 0)); see the module doc.
        self_loops: count a template repeated in a session (T -> T): it is the commonest
            "what follows T", and the planner's boost skips it (T's own forecast covers it).
    """

    half_life_s: float = DEFAULT_HALF_LIFE_S
    max_gap_s: float = 600.0
    min_support: int = 5
    phrase_words: int = 6
    similarity: str = "affine"
    self_loops: bool = True

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.max_gap_s > 0):
            raise ValueError("half_life_s and max_gap_s must be positive")
        if self.min_support < 1 or self.phrase_words < 1:
            raise ValueError("min_support and phrase_words must be at least 1")
        if self.similarity not in ("affine", "positive"):
            raise ValueError(f"similarity {self.similarity!r}: choose 'affine' or 'positive'")


def phrase_key(prompt: str, words: int = 6) -> str | None:
    """`phrase:<first words>`: lower-case alphanumeric runs, every number as `#`; None if empty."""
    found = [w if not w.isdigit() else "#" for w in _WORD.findall(prompt.lower())[:words]]
    return "phrase:" + " ".join(found) if found else None


def node_keys(
    requests: pd.DataFrame,
    config: HotspotConfig | None = None,
    mined: Callable[[str, str], str | None] | None = None,
) -> pd.Series:
    """Each request's node: `template:<template_id>` (the log's own id, named like the planner's
    demand key), else `mined:<id>` from `mined(tenant, prompt)`, else its phrase if the tenant
    has `min_support` requests of it; else <NA>.

    Raises:
        ValueError: a missing column (`tenant`, `template_id`, `prompt`).
    """
    config = config or HotspotConfig()
    _require(requests, ("tenant", "template_id", "prompt"))
    keys = np.full(len(requests), pd.NA, dtype=object)  # (N,) by position: the index may repeat
    labelled = requests["template_id"].notna().to_numpy(dtype=bool)
    keys[labelled] = ("template:" + requests["template_id"][labelled].astype(str)).to_numpy()
    rest = np.flatnonzero(~labelled & requests["prompt"].notna().to_numpy(dtype=bool))
    tenants, prompts = requests["tenant"].to_numpy()[rest], requests["prompt"].to_numpy()[rest]
    phrases = []
    for i, tenant, prompt in zip(rest, tenants, prompts, strict=True):
        found = mined(str(tenant), str(prompt)) if mined is not None else None
        if found is not None:
            keys[i] = f"mined:{found}"
        else:
            phrases.append((i, str(tenant), phrase_key(str(prompt), config.phrase_words)))
    counts = Counter((tenant, phrase) for _, tenant, phrase in phrases)
    for i, tenant, phrase in phrases:
        if phrase is not None and counts[tenant, phrase] >= config.min_support:
            keys[i] = phrase
    return pd.Series(keys, index=requests.index, dtype=object)


def node_vectors(
    rows: pd.DataFrame, embed: Callable[[list[str]], np.ndarray], per_node: int = 8
) -> dict[tuple[str, str], np.ndarray]:
    """Each node's centroid: the unit mean of its `per_node` commonest distinct prompts' unit
    embeddings (a template's slots vary; its commonest fillings stand for it at a fixed cost)."""
    _require(rows, ("tenant", "node", "prompt"))
    keyed = rows.dropna(subset=["node", "prompt"])
    counted = keyed.groupby(["tenant", "node", "prompt"], sort=False).size().rename("n")
    counted = counted.reset_index().sort_values("n", ascending=False, kind="stable")
    chosen = counted.groupby(["tenant", "node"], sort=False).head(per_node)
    if chosen.empty:
        return {}
    vectors = np.asarray(embed(chosen["prompt"].astype(str).tolist()), dtype=np.float64)  # (N, D)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    codes, owners = pd.factorize(pd.MultiIndex.from_arrays([chosen["tenant"], chosen["node"]]))
    sums = np.zeros((len(owners), vectors.shape[1]))  # (nodes, D): the sum points like the mean
    np.add.at(sums, codes, vectors)
    sums /= np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    return {(str(t), str(n)): sums[i] for i, (t, n) in enumerate(owners)}


def _require(frame: pd.DataFrame, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"missing column(s) {', '.join(missing)}; need {', '.join(columns)}")


@dataclass
class HotspotGraph:
    """Nodes (`HotspotNode` rows), edges (`HotspotEdge` rows) and the parameters built with."""

    nodes: pd.DataFrame
    edges: pd.DataFrame
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes, self.edges = validate_graph(self.nodes, self.edges)

    def follows(self, tenant: str, node: str, k: int = 5) -> list[tuple[str, float]]:
        """What usually follows `node` in `tenant`'s sessions: up to `k` (target, P(target |
        node)) by probability; [] for a node with no successor seen (or never seen)."""
        out = self.edges[(self.edges["tenant"] == tenant) & (self.edges["source"] == node)]
        out = out.sort_values(["probability", "target"], ascending=[False, True]).head(k)
        return [(str(t), float(p)) for t, p in zip(out["target"], out["probability"], strict=True)]

    def successor_boost(self, predictions: pd.DataFrame, weight: float) -> pd.DataFrame:
        """`predictions` (tenant, key, hits) with hits[B] += weight x sum over A != B of
        hits[A] x c(A) x P(B | A); c(A) = the share of A's requests that a next request (of any
        node, A included) followed within the gap, so hits[A] x c(A) are A's follow-ons.

        Why: the forecaster reads each key's own history, so a surge on A reaches B's forecast
        only once B's own series has risen, one bucket late; the graph moves it now. It is a
        tilt, not a calibrated forecast: B's usual follow-on traffic is already in B's own
        prediction and is counted again, which is why it is off by default and scaled by
        `weight`. Self-loops are skipped (A's repeats are A's own forecast).
        """
        if weight < 0 or not math.isfinite(weight):
            raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
        if weight == 0 or predictions.empty or self.edges.empty:
            return predictions
        out_count = self.edges.groupby(["tenant", "source"], observed=True)["transitions"].sum()
        volume = self.nodes.set_index(["tenant", "node"])["volume"]
        keys = _pairs(predictions, "key")
        hot = dict(zip(keys, predictions["hits"].astype(float), strict=True))
        extra: dict[tuple[str, str], float] = {}
        sources = _pairs(self.edges, "source")
        for (tenant, source), target, p in zip(
            sources, self.edges["target"].astype(str), self.edges["probability"], strict=True
        ):
            if (tenant, source) not in hot or source == target:
                continue
            follows = out_count[tenant, source] / volume[tenant, source]
            gained = weight * hot[tenant, source] * follows * float(p)
            extra[tenant, target] = extra.get((tenant, target), 0.0) + gained
        added = np.array([extra.get(k, 0.0) for k in keys], dtype=np.float64)  # (len(predictions),)
        return predictions.assign(hits=predictions["hits"].astype(float) + added)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "params": self.params,
            "nodes": _records(self.nodes, NODE_COLUMNS),
            "edges": _records(self.edges, EDGE_COLUMNS),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HotspotGraph:
        """Raises ValueError for another format; contract errors for bad tables."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a hotspot graph: format {data.get('format')!r}, want {FORMAT}")
        nodes = pd.DataFrame(list(data["nodes"]), columns=list(NODE_COLUMNS))
        edges = pd.DataFrame(list(data["edges"]), columns=list(EDGE_COLUMNS))
        return cls(nodes, edges, dict(data.get("params", {})))

    def to_json(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return path

    @classmethod
    def from_json(cls, path: Path) -> HotspotGraph:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def draw(self, path: Path, top: int = 40) -> Path:
        """A PNG of the `top` nodes by volume: size ~ volume, colour = tenant, arrows' opacity =
        P(target | source); a self-loop is drawn as the node's ring width (not an arrow)."""
        return _draw(self.nodes, self.edges, Path(path), top)


def _pairs(frame: pd.DataFrame, column: str) -> list[tuple[str, str]]:
    return list(zip(frame["tenant"].astype(str), frame[column].astype(str), strict=True))


def _records(frame: pd.DataFrame, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {c: (v.item() if isinstance(v, np.generic) else v) for c, v in row.items()}
        for row in frame[list(columns)].astype(object).to_dict(orient="records")
    ]


def keyed_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with a node, as plain str columns and UTC timestamps.

    Raises:
        ValueError: a missing column. NoSessionNodes: no row has a node.
    """
    _require(rows, GRAPH_COLUMNS)
    rows = rows.dropna(subset=["node"])
    if rows.empty:
        raise NoSessionNodes("no request has a node (a template id or a frequent phrase)")
    frame = pd.DataFrame({c: rows[c].astype(str) for c in ("tenant", "session_id", "node")})
    frame["timestamp"] = pd.to_datetime(rows["timestamp"], utc=True)
    return frame


def build_hotspot_graph(
    rows: pd.DataFrame,
    vectors: NodeVectors,
    config: HotspotConfig | None = None,
    now: pd.Timestamp | None = None,
) -> HotspotGraph:
    """The graph of `rows` (`GRAPH_COLUMNS`; `node` from `node_keys`, <NA> rows skipped).

    Args:
        rows: requests with tenant, session_id, timestamp (UTC) and node.
        vectors: (tenant, node) -> unit embedding (a centroid: `node_vectors`).
        config: the knobs; now: the decay's reference time (default the latest request).

    Raises:
        ValueError: a missing column or a node without a vector. NoSessionNodes: no row has a
            node.
    """
    config = config or HotspotConfig()
    frame = keyed_rows(rows)
    missing = [k for k in zip(frame["tenant"], frame["node"], strict=True) if k not in vectors]
    if missing:
        raise ValueError(f"no vector for node {missing[0][1]!r} of tenant {missing[0][0]!r}")
    now = frame["timestamp"].max() if now is None else pd.Timestamp(now)
    frame = frame.sort_values(["tenant", "session_id", "timestamp"], kind="stable")
    nodes = frame.groupby(["tenant", "node"], sort=True).agg(
        volume=("session_id", "size"), sessions=("session_id", "nunique")
    )
    nodes = nodes.reset_index().assign(kind=lambda f: f["node"].str.split(":").str[0])
    edges = _edges(frame, vectors, config, now)
    params = {**asdict(config), "now": now.isoformat(), "weight": _WEIGHT[config.similarity]}
    return HotspotGraph(nodes[list(NODE_COLUMNS)], edges, params)


_WEIGHT = {
    "affine": "(1 + cos) / 2 x sum 2^(-age / half_life_s)",
    "positive": "max(cos, 0) x sum 2^(-age / half_life_s)",
}


def _edges(
    frame: pd.DataFrame, vectors: NodeVectors, config: HotspotConfig, now: pd.Timestamp
) -> pd.DataFrame:
    """Consecutive requests of a session (frame sorted by tenant, session, time) -> edges."""
    after = frame.shift(-1)
    same = (frame["tenant"] == after["tenant"]) & (frame["session_id"] == after["session_id"])
    gap_s = (after["timestamp"] - frame["timestamp"]).dt.total_seconds()
    keep = same & (gap_s <= config.max_gap_s)
    if not config.self_loops:
        keep &= frame["node"] != after["node"]
    age_s = (now - after["timestamp"][keep]).dt.total_seconds().clip(lower=0.0)
    pairs = pd.DataFrame(
        {
            "tenant": frame["tenant"][keep],
            "source": frame["node"][keep],
            "target": after["node"][keep],
            "decay": np.exp2(-age_s.to_numpy(dtype=np.float64) / config.half_life_s),
        }
    )
    edges = pairs.groupby(["tenant", "source", "target"], sort=True).agg(
        transitions=("decay", "size"), decayed=("decay", "sum")
    )
    edges = edges.reset_index()
    cos = np.array(
        [
            float(np.dot(vectors[t, s], vectors[t, d]))
            for t, s, d in zip(edges["tenant"], edges["source"], edges["target"], strict=True)
        ],
        dtype=np.float64,
    )  # (E,)
    similarity = (1.0 + cos) / 2.0 if config.similarity == "affine" else cos
    edges["similarity"] = np.clip(similarity, 0.0, 1.0)
    edges["weight"] = edges["decayed"] * edges["similarity"]
    # A weight of 0 (opposite meanings under "positive", or a decay that underflowed) says
    # nothing about what follows: dropped, so every source's probabilities are a distribution.
    edges = edges[edges["weight"] > 0].reset_index(drop=True)
    total = edges.groupby(["tenant", "source"])["weight"].transform("sum")
    edges["probability"] = edges["weight"] / total
    return edges[list(EDGE_COLUMNS)]


def _draw(nodes: pd.DataFrame, edges: pd.DataFrame, path: Path, top: int) -> Path:
    """networkx lays out (spring, seeded: the same graph draws the same), matplotlib draws on
    a `Figure` (no pyplot: no global backend, nothing left open)."""
    import networkx as nx
    from matplotlib.figure import Figure

    shown = nodes.sort_values(["volume", "node"], ascending=[False, True]).head(top)
    names = [f"{t}/{n}" for t, n in zip(shown["tenant"], shown["node"], strict=True)]
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    ring = dict.fromkeys(names, 0.0)
    for t, s, d, p in zip(edges["tenant"], edges["source"], edges["target"],
                          edges["probability"], strict=True):  # fmt: skip
        a, b = f"{t}/{s}", f"{t}/{d}"
        if a in ring and a == b:
            ring[a] = float(p)
        elif a in ring and b in ring:
            graph.add_edge(a, b, probability=float(p))
    pos = nx.spring_layout(graph, seed=0, weight="probability")  # name -> (2,)
    tenants = sorted(set(shown["tenant"]))
    sizes = 40 + 600 * shown["volume"].to_numpy() / max(int(shown["volume"].max()), 1)  # (n,)
    radius = dict(zip(names, np.sqrt(sizes) / 2 + 2, strict=True))  # points
    fig = Figure(figsize=(12, 9))
    ax = fig.add_subplot()
    for a, b, data in graph.edges(data=True):
        ax.annotate("", xy=pos[b], xytext=pos[a], arrowprops={
            "arrowstyle": "-|>", "mutation_scale": 14, "color": "0.2",
            "alpha": 0.15 + 0.85 * data["probability"], "connectionstyle": "arc3,rad=0.1",
            "shrinkA": radius[a], "shrinkB": radius[b],
        })  # fmt: skip
    xy = np.array([pos[n] for n in names]).reshape(-1, 2)  # (n, 2)
    colours = [tenants.index(t) for t in shown["tenant"]]
    rings = [0.5 + 2.5 * ring[n] for n in names]
    ax.scatter(xy[:, 0], xy[:, 1], s=sizes, c=colours, cmap="tab10", vmin=0, vmax=9,
               edgecolors="black", linewidths=rings, zorder=3)  # fmt: skip
    for name, (x, y) in zip(names, xy, strict=True):
        ax.annotate(name[:40], (x, y), xytext=(0, radius[name]), textcoords="offset points",
                    fontsize=6, ha="center", va="bottom", zorder=4)  # fmt: skip
    ax.set_title(f"hotspot graph: top {len(names)} nodes of {len(nodes)}, tenants "
                 f"{', '.join(tenants)}; arrow opacity = P(next), ring = P(repeat)")  # fmt: skip
    ax.set_axis_off()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path

"""`HotspotNode` and `HotspotEdge`: the hotspot graph's tables (what follows what in sessions).

Built by `models.templates.hotspot` in the `mine-templates` flow, exported as JSON beside the
templates table, read back by the warm-up planner (successors of the keys that are hot now). The
contract sits at that boundary: a graph the planner loads must have one row per tenant and node,
edges only between known nodes of the same tenant, and per-source probabilities that sum to 1.
Rejected: a lake table (append-only, deduplicated by row key), for the reason the templates table
is not one: a re-mining replaces the graph whole.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.dtypes import STRING, STRING_KW

NODE_KINDS: tuple[str, ...] = ("template", "mined", "phrase")
NODE_COLUMNS: tuple[str, ...] = ("tenant", "node", "kind", "volume", "sessions")
EDGE_COLUMNS: tuple[str, ...] = (
    "tenant", "source", "target", "transitions", "decayed", "similarity", "weight", "probability",
)  # fmt: skip
_TENANT = {"min_value": 1, "max_value": 64}
_NODE = {"min_value": 1, "max_value": 400}
_PROBABILITY_TOLERANCE = 1e-6


class HotspotNode(pa.DataFrameModel):
    """One node of one tenant: a template (the log's or a mined one) or a frequent phrase.

    `node` is namespaced by `kind` (`template:<id>`, `mined:<id>`, `phrase:<words>`), so a
    `template:` node is named exactly like the demand key the planner uses. `volume` counts the
    node's requests, `sessions` the distinct sessions it appears in.
    """

    tenant: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_TENANT)
    node: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NODE)
    kind: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(NODE_KINDS))
    volume: Series[int] = pa.Field(ge=1)
    sessions: Series[int] = pa.Field(ge=1)

    @pa.dataframe_check(name="one_row_per_tenant_node")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "node"])

    @pa.dataframe_check(name="node_starts_with_its_kind")
    def _namespaced(cls, df: pd.DataFrame) -> Series[bool]:
        ok = [str(n).startswith(f"{k}:") for n, k in zip(df["node"], df["kind"], strict=True)]
        return pd.Series(ok, index=df.index)

    class Config:
        coerce = True
        strict = True
        ordered = True


class HotspotEdge(pa.DataFrameModel):
    """A directed edge `source -> target` of one tenant: `target` came next in a session.

    `transitions` counts them, `decayed` sums their time-decay factors (1 for one right at the
    graph's `now`), `similarity` is the nodes' semantic-similarity term in [0, 1], `weight` =
    decayed x similarity, and `probability` is the weight over the source's total out-weight.
    """

    tenant: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_TENANT)
    source: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NODE)
    target: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NODE)
    transitions: Series[int] = pa.Field(ge=1)
    decayed: Series[float] = pa.Field(gt=0)
    similarity: Series[float] = pa.Field(ge=0, le=1)
    weight: Series[float] = pa.Field(gt=0)
    probability: Series[float] = pa.Field(gt=0, le=1)

    @pa.dataframe_check(name="one_row_per_tenant_edge")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "source", "target"])

    @pa.dataframe_check(name="probabilities_sum_to_one_per_source")
    def _normalised(cls, df: pd.DataFrame) -> Series[bool]:
        total = df.groupby(["tenant", "source"], observed=True)["probability"].transform("sum")
        return pd.Series(np.abs(total.to_numpy() - 1.0) <= _PROBABILITY_TOLERANCE, index=df.index)

    class Config:
        coerce = True
        strict = True
        ordered = True


def validate_graph(nodes: pd.DataFrame, edges: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both tables validated, and every edge's ends known nodes of the edge's tenant.

    Raises:
        pandera.errors.SchemaErrors: a table breaks its contract.
        ValueError: an edge names a node its tenant does not have (the first one is named).
    """
    nodes = HotspotNode.validate(_typed(nodes, NODE_COLUMNS), lazy=True)
    edges = HotspotEdge.validate(_typed(edges, EDGE_COLUMNS), lazy=True)
    known = pd.MultiIndex.from_arrays([nodes["tenant"], nodes["node"]])
    for end in ("source", "target"):
        found = pd.MultiIndex.from_arrays([edges["tenant"], edges[end]]).isin(known)
        if not found.all():
            row = edges[~found].iloc[0]
            raise ValueError(
                f"edge {row['source']} -> {row['target']} of tenant {row['tenant']}: "
                f"{end} {row[end]!r} is not a node of that tenant"
            )
    return nodes, edges


def _typed(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """An empty frame gets the text columns' dtype (pandera cannot coerce an untyped empty one)."""
    if len(frame):
        return frame
    return pd.DataFrame(
        {c: pd.Series(dtype=frame[c].dtype if c in frame else STRING) for c in columns}
    )

"""`WarmupCandidate` and `WarmupPlan`: what could be warmed, and what the planner chose.

A candidate is one cache item (a KV prefix, a response, an embedding) with what warming it would
earn (predicted hits x latency saved per hit) and cost (bytes, compute seconds). Items of a
tenant are unique and may name a `parent`: an item that must be warmed before them, as a
template's KV pages need the shared system-prompt pages they are chained to. The plan is the
chosen candidates in execution order, each with its tier, its modelled schedule and a reason.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.dtypes import STRING_KW

WARMUP_KINDS: tuple[str, ...] = ("kv_prefix", "response", "embedding")
# best informed first: the hot-set combination (its shares of the forecast's or the heat's
# volume), the forecast alone, then the fallbacks
WARMUP_SOURCES: tuple[str, ...] = ("hotset", "forecast", "heat", "recency_frequency")
TIERS: tuple[str, ...] = ("memory", "ssd", "redis")  # fastest first

_TENANT = {"min_value": 1, "max_value": 64}
_NAME = {"min_value": 1, "max_value": 400}


def _key_pairs(df: pd.DataFrame, column: str) -> pd.MultiIndex:
    return pd.MultiIndex.from_arrays([df["tenant"], df[column]])


def _parents_known(df: pd.DataFrame, known: pd.DataFrame) -> pd.Series:
    """True where `parent` is null or names an item of the same tenant in `known`."""
    has_parent = df["parent"].notna().to_numpy(dtype=bool)
    found = _key_pairs(df, "parent").isin(_key_pairs(known, "item"))
    return pd.Series(~has_parent | found, index=df.index)


class WarmupCandidate(pa.DataFrameModel):
    """One item that could be warmed.

    `predicted_hits` are over the plan's horizon; `latency_saved_s` is per hit, so their product
    is the seconds of user latency that warming saves. `fanout` is how many demand keys share
    the item (a shared system prompt serves every template built on it). `needed_in_s` is the
    SLA countdown: seconds from now until the item's first predicted request. `source` says where
    the prediction came from; anything but `forecast` is a fallback.
    """

    tenant: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_TENANT)
    key: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NAME)
    item: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NAME)
    kind: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(WARMUP_KINDS))
    parent: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, nullable=True)
    predicted_hits: Series[float] = pa.Field(ge=0)
    latency_saved_s: Series[float] = pa.Field(ge=0)
    bytes: Series[int] = pa.Field(gt=0)
    compute_s: Series[float] = pa.Field(ge=0)
    fanout: Series[int] = pa.Field(ge=1)
    needed_in_s: Series[float] = pa.Field(ge=0)
    source: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(WARMUP_SOURCES))

    @pa.dataframe_check(name="one_row_per_tenant_item")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "item"])

    @pa.dataframe_check(name="parent_is_a_candidate_of_the_same_tenant")
    def _parent_known(cls, df: pd.DataFrame) -> Series[bool]:
        # The planner keeps plans prefix-closed: it must see a parent to decide on its children.
        return _parents_known(df, df)

    @pa.dataframe_check(name="parent_is_not_the_item_itself")
    def _not_self(cls, df: pd.DataFrame) -> Series[bool]:
        same = (df["parent"] == df["item"]).fillna(False).to_numpy(dtype=bool)
        return pd.Series(~same, index=df.index)

    class Config:
        coerce = True
        strict = True
        ordered = True


class WarmupPlan(pa.DataFrameModel):
    """The chosen items in execution order (`order` 0..n-1).

    `score` is predicted_hits x latency_saved_s. `start_s`/`finish_s` are the modelled schedule
    (items produced one after another on the node, each taking its `compute_s`). A parent that
    is planned comes earlier than its children and in the same or a faster tier (the memory
    tier refuses a KV page whose parent page it does not hold). `reason` is one line on why the
    item is in.
    """

    order: Series[int] = pa.Field(ge=0, unique=True)
    tenant: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_TENANT)
    key: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NAME)
    item: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_NAME)
    kind: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(WARMUP_KINDS))
    parent: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, nullable=True)
    tier: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(TIERS))
    score: Series[float] = pa.Field(ge=0)
    predicted_hits: Series[float] = pa.Field(ge=0)
    latency_saved_s: Series[float] = pa.Field(ge=0)
    bytes: Series[int] = pa.Field(gt=0)
    compute_s: Series[float] = pa.Field(ge=0)
    start_s: Series[float] = pa.Field(ge=0)
    finish_s: Series[float] = pa.Field(ge=0)
    source: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(WARMUP_SOURCES))
    reason: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length={"min_value": 1})

    @pa.dataframe_check(name="orders_are_0_to_n_minus_1")
    def _dense_orders(cls, df: pd.DataFrame) -> Series[bool]:
        return pd.Series(df["order"].to_numpy() < len(df), index=df.index)

    @pa.dataframe_check(name="one_row_per_tenant_item")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "item"])

    @pa.dataframe_check(name="finish_not_before_start")
    def _schedule(cls, df: pd.DataFrame) -> Series[bool]:
        return df["finish_s"] >= df["start_s"]

    @pa.dataframe_check(name="planned_parent_comes_earlier_in_a_tier_no_slower")
    def _parent_first(cls, df: pd.DataFrame) -> Series[bool]:
        items = _key_pairs(df, "item")
        if not items.is_unique:  # `one_row_per_tenant_item` reports it; no parent is ambiguous
            return pd.Series(True, index=df.index)
        at = items.get_indexer(_key_pairs(df, "parent"))  # -1: no parent, or not planned
        planned = at >= 0
        order = df["order"].to_numpy()
        ranks = {name: rank for rank, name in enumerate(TIERS)}
        tier = df["tier"].map(ranks).fillna(0).to_numpy(dtype="int64")  # bad names: `isin` fails
        parent_at = np.where(planned, at, 0)
        ok = (order[parent_at] < order) & (tier[parent_at] <= tier)
        return pd.Series(~planned | ok, index=df.index)

    class Config:
        coerce = True
        strict = True
        ordered = True

"""KV-prefix candidates: each key's majority run of prefix blocks, and the runs keys share.

A key's run is the leading blocks that more than half of its requests have (position by
position, the majority block hash). "More than half" makes the majority unique, and chained
hashes make the run contiguous: a request with block i's hash has every block before it. Keys
of a tenant whose runs start with the same block share a parent: their longest common run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cache_runtime.prefix_hash import PAGE_TOKENS
from data_contracts.dtypes import STRING
from data_contracts.warmup import WARMUP_SOURCES

SOURCE_RANK = {source: rank for rank, source in enumerate(WARMUP_SOURCES)}
_SOURCES = np.array(WARMUP_SOURCES, dtype=object)


def majority_runs(recent: pd.DataFrame) -> tuple[pd.DataFrame, pd.MultiIndex, np.ndarray]:
    """(runs, keys, requests per key): runs has one row per (k, pos) of each key's run, with
    its majority `hash` and `count`; k indexes `keys` (tenant, key)."""
    codes, keys = pd.MultiIndex.from_frame(recent[["tenant", "key"]]).factorize()
    requests = np.bincount(codes, minlength=len(keys))
    hashes = recent["prefix_hashes"]
    lengths = hashes.list.len().fillna(0).to_numpy(dtype="int64")
    row = np.repeat(np.arange(len(recent)), lengths)
    flat = hashes.list.flatten().to_numpy(dtype="int64") if len(row) else np.zeros(0, "int64")
    pos = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    blocks = pd.DataFrame({"k": codes[row], "pos": pos, "hash": flat})
    counts = blocks.groupby(["k", "pos", "hash"]).size().rename("count").reset_index()
    counts = counts[counts["count"].to_numpy() * 2 > requests[counts["k"].to_numpy()]]
    leading = counts.groupby("k").cumcount().to_numpy() == counts["pos"].to_numpy()
    return counts[leading].reset_index(drop=True), keys, requests


def _shared_runs(runs: pd.DataFrame, chains: pd.DataFrame) -> pd.DataFrame:
    """Per (tenant, first) group of 2+ keys: `shared` blocks in common and the last one's hash."""
    grouped = chains[chains["members"] >= 2]
    member = runs[runs["k"].isin(grouped.index)]
    member = member.join(grouped[["tenant", "first", "members"]], on="k")
    per_pos = (
        member.groupby(["tenant", "first", "pos"])
        .agg(
            n=("hash", "size"),
            distinct=("hash", "nunique"),
            hash=("hash", "first"),
            members=("members", "first"),
        )
        .reset_index()
    )
    common = per_pos[(per_pos["n"] == per_pos["members"]) & (per_pos["distinct"] == 1)]
    common = common[common.groupby(["tenant", "first"]).cumcount() == common["pos"]]
    shared = common.groupby(["tenant", "first"]).agg(
        shared=("pos", "size"), shared_last=("hash", "last")
    )
    return shared.astype({"shared_last": "Int64"})  # a float would round 64-bit hashes


def _chains(runs: pd.DataFrame, keys: pd.MultiIndex, requests: np.ndarray) -> pd.DataFrame:
    """Per key k: run length, first and last hash, share of requests with the whole run, and
    the shared parent run (shared = 0 when the key shares its first block with no other key)."""
    chains = runs.groupby("k").agg(
        blocks=("pos", "size"),
        first=("hash", "first"),
        last=("hash", "last"),
        count_last=("count", "last"),
    )
    chains["tenant"] = pd.factorize(keys.get_level_values(0))[0][chains.index]
    chains["members"] = chains.groupby(["tenant", "first"])["blocks"].transform("size")
    chains["share"] = chains["count_last"] / requests[chains.index]
    chains = chains.join(_shared_runs(runs, chains), on=["tenant", "first"])
    chains["shared"] = chains["shared"].fillna(0).astype("int64")
    at = pd.MultiIndex.from_frame(runs[["k", "pos"]]).get_indexer(
        pd.MultiIndex.from_arrays([chains.index, np.maximum(chains["shared"] - 1, 0)])
    )
    chains["shared_share"] = runs["count"].to_numpy()[at] / requests[chains.index]
    return chains


def _costs(blocks: pd.Series, kv_bytes_per_token: int, prefill_s_per_token: float) -> dict:
    tokens = blocks.to_numpy(dtype="int64") * PAGE_TOKENS
    seconds = tokens * prefill_s_per_token
    return {
        "bytes": tokens * int(kv_bytes_per_token),
        "compute_s": seconds,
        "latency_saved_s": seconds,
    }


def kv_candidates(
    recent: pd.DataFrame,
    predictions: pd.DataFrame,
    kv_bytes_per_token: int,
    prefill_s_per_token: float,
) -> pd.DataFrame:
    """Own and shared KV-prefix candidates (WarmupCandidate columns, not yet validated).

    Own item of a key: `kv:<key>`, or `kv:prefix:<last hash>` for a `prefix:` key (named by its
    content, so it cannot collide with a shared parent). Its hits are the key's hits times the
    share of its requests with the whole run; a shared parent's are the sum over its keys.
    """
    runs, keys, requests = majority_runs(recent)
    if runs.empty:
        return pd.DataFrame()
    chains = _chains(runs, keys, requests)
    at = keys.get_indexer(pd.MultiIndex.from_frame(predictions[["tenant", "key"]]))
    chains = chains.join(predictions.set_index(pd.Index(at))[["hits", "needed_in_s", "source"]])
    chains["tenant_name"] = keys.get_level_values(0)[chains.index]
    chains["key"] = keys.get_level_values(1)[chains.index]
    parent_name = "kv:prefix:" + chains["shared_last"].astype("Int64").astype(str)
    own = chains[chains["blocks"] > chains["shared"]]
    is_prefix = own["key"].str.startswith("prefix:")
    own_items = np.where(is_prefix, "kv:prefix:" + own["last"].astype(str), "kv:" + own["key"])
    own_frame = pd.DataFrame(
        {
            "tenant": own["tenant_name"],
            "key": own["key"],
            "item": own_items,
            "parent": parent_name[own.index].where(own["shared"] > 0, None),
            "predicted_hits": own["hits"] * own["share"],
            "fanout": 1,
            "needed_in_s": own["needed_in_s"],
            "source": own["source"],
            **_costs(own["blocks"] - own["shared"], kv_bytes_per_token, prefill_s_per_token),
        }
    )
    return (
        pd.concat(
            [own_frame, _parents(chains, parent_name, kv_bytes_per_token, prefill_s_per_token)],
            ignore_index=True,
        )
        .assign(kind="kv_prefix")
        .astype({"tenant": STRING, "key": STRING, "item": STRING, "parent": STRING})
    )


def _parents(
    chains: pd.DataFrame, parent_name: pd.Series, kv_bytes_per_token: int, prefill_s: float
) -> pd.DataFrame:
    """One candidate per shared run: hits summed, the most urgent need, the weakest source."""
    members = chains[chains["shared"] > 0].assign(
        item=parent_name,
        shared_hits=lambda f: f["hits"] * f["shared_share"],
        source_rank=lambda f: f["source"].map(SOURCE_RANK),
    )
    groups = (
        members.groupby(["tenant", "first"])
        .agg(
            tenant_name=("tenant_name", "first"),
            item=("item", "first"),
            predicted_hits=("shared_hits", "sum"),
            needed_in_s=("needed_in_s", "min"),
            fanout=("key", "size"),
            source_rank=("source_rank", "max"),
            shared=("shared", "first"),
        )
        .reset_index()
    )
    return pd.DataFrame(
        {
            "tenant": groups["tenant_name"],
            "key": "prefix:" + groups["first"].astype(str),
            "item": groups["item"],
            "parent": None,
            "predicted_hits": groups["predicted_hits"],
            "fanout": groups["fanout"],
            "needed_in_s": groups["needed_in_s"],
            "source": _SOURCES[groups["source_rank"].to_numpy(dtype="int64")],
            **_costs(groups["shared"], kv_bytes_per_token, prefill_s),
        }
    )

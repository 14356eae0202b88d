"""The plan's items with the text that warms each one.

A plan names items; warming needs text:

- a KV prefix item names a run of prefix blocks: `kv:prefix:<hash>` by its last block's chained
  hash, `kv:<key>` by a key's majority run (recomputed with `kv_chains.majority_runs` from the
  same requests the candidates came from, `candidates.recent_requests`). Its text is what every
  request holding that last hash starts with — chained hashes guarantee those requests share
  every token of the run, so their common text covers it — cut back to a word boundary so it
  tokenises as the start of each of them. A shared parent's text is therefore a prefix of each
  child's. Rejected: the key's most frequent prompt, which would also warm one request's own
  tail (pages nobody else reuses) and, for a parent, one child's text.
- a response or an embedding item names one exact prompt (by the digest the candidates used);
  its text is that prompt.

An item whose text cannot be found (a trace without prompts, prompts that share no text) gets
`text=None`: the executor records it as unresolved rather than guessing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import orjson
import pandas as pd

from models.warmup.kv_chains import majority_runs


@dataclass(frozen=True)
class WarmItem:
    """One planned item with the text that warms it (None: unresolved)."""

    order: int
    tenant: str
    item: str
    kind: str
    parent: str | None
    tier: str
    text: str | None

    @property
    def ident(self) -> tuple[str, str]:
        return (self.tenant, self.item)


def _common_prefix(texts: list[str]) -> str:
    """The longest prefix of all `texts`: that of the lexicographic min and max."""
    low, high = min(texts), max(texts)
    for i, (a, b) in enumerate(zip(low, high, strict=False)):
        if a != b:
            return low[:i]
    return low


def shared_text(prompts: Sequence[str]) -> str | None:
    """The text all `prompts` start with, cut back to a word boundary and stripped of trailing
    whitespace (a BPE tokenizer glues a leading space to the next word, so a prefix ending in
    one would not tokenise as the start of the prompts); None when nothing is left."""
    distinct = list(dict.fromkeys(p for p in prompts if isinstance(p, str)))
    if not distinct:
        return None
    common = _common_prefix(distinct)
    end = len(common)
    if not all(len(p) == end or p[end].isspace() for p in distinct):
        boundary = re.search(r"\s\S*$", common)  # the common text ends inside a word
        common = common[: boundary.start()] if boundary else ""
    return common.rstrip() or None


def _kv_last_hashes(kv: pd.DataFrame, recent: pd.DataFrame) -> list[int | None]:
    """The last block hash of each KV item's run, in `kv`'s row order."""
    runs, keys, _ = majority_runs(recent)
    last = runs.groupby("k")["hash"].last()
    by_key = {keys[k]: int(h) for k, h in last.items()}
    hashes: list[int | None] = []
    for tenant, item in zip(kv["tenant"].tolist(), kv["item"].tolist(), strict=True):
        if item.startswith("kv:prefix:"):
            hashes.append(int(item.removeprefix("kv:prefix:")))
        else:
            hashes.append(by_key.get((tenant, item.removeprefix("kv:"))))
    return hashes


def _holders(recent: pd.DataFrame, wanted: np.ndarray) -> dict[tuple[str, int], list[str]]:
    """(tenant, hash) -> prompts of the requests whose prefix blocks include that hash."""
    rows = recent.dropna(subset=["prompt", "prefix_hashes"]).reset_index(drop=True)
    lengths = rows["prefix_hashes"].list.len().to_numpy(dtype="int64")
    row = np.repeat(np.arange(len(rows)), lengths)
    if not len(row):
        return {}
    flat = rows["prefix_hashes"].list.flatten().to_numpy(dtype="int64")
    hit = np.isin(flat, wanted)
    holders = pd.DataFrame(
        {
            "tenant": rows["tenant"].to_numpy(dtype=object)[row[hit]],
            "hash": flat[hit],
            "prompt": rows["prompt"].to_numpy(dtype=object)[row[hit]],
        }
    )
    return holders.groupby(["tenant", "hash"])["prompt"].agg(list).to_dict()


def _kv_texts(kv: pd.DataFrame, recent: pd.DataFrame) -> dict[tuple[str, str], str | None]:
    """KV item -> the common text of its tenant's requests holding its run's last hash."""
    hashes = _kv_last_hashes(kv, recent)
    prompts = _holders(recent, np.array([h for h in hashes if h is not None], dtype="int64"))
    return {
        (tenant, item): None if h is None else shared_text(prompts.get((tenant, h), []))
        for tenant, item, h in zip(kv["tenant"].tolist(), kv["item"].tolist(), hashes, strict=True)
    }


def _prompt_texts(recent: pd.DataFrame) -> dict[tuple[str, str], str]:
    """`response:`/`embedding:` item names -> their exact prompt (the candidates' digest)."""
    prompts = recent.dropna(subset=["prompt"])[["tenant", "key", "prompt"]].drop_duplicates()
    if prompts.empty:
        return {}
    text = prompts["prompt"].to_numpy(dtype=object)
    digest = pd.util.hash_array(text)
    names = [
        f"{key}:{d:016x}" for key, d in zip(prompts["key"].tolist(), digest.tolist(), strict=True)
    ]
    texts = {}
    for tenant, name, prompt in zip(prompts["tenant"].tolist(), names, text.tolist(), strict=True):
        texts[(tenant, f"response:{name}")] = prompt
        texts[(tenant, f"embedding:{name}")] = prompt
    return texts


def resolve_items(plan: pd.DataFrame, recent: pd.DataFrame) -> list[WarmItem]:
    """The plan's rows as `WarmItem`s with their texts (rules: module docstring).

    Args:
        plan: a `WarmupPlan`.
        recent: the requests the candidates were built from (`candidates.recent_requests`).
    """
    kv = plan[plan["kind"] == "kv_prefix"]
    texts: dict[tuple[str, str], str | None] = {}
    if len(kv) and len(recent):
        texts.update(_kv_texts(kv, recent))
    if (plan["kind"] != "kv_prefix").any():
        texts.update(_prompt_texts(recent))
    columns = ["order", "tenant", "item", "kind", "parent", "tier"]
    rows = plan[columns].astype(object).where(plan[columns].notna(), None)
    return [
        WarmItem(int(order), tenant, item, kind, parent, tier, texts.get((tenant, item)))
        for order, tenant, item, kind, parent, tier in rows.itertuples(index=False)
    ]


def plan_id(items: Sequence[WarmItem]) -> str:
    """16 hex digits naming the plan: its rows and their texts, in order."""
    rows = [list(asdict(item).values()) for item in sorted(items, key=lambda i: i.order)]
    return hashlib.blake2b(orjson.dumps(rows), digest_size=8).hexdigest()

"""Reads of a KV prefix chain across the tiers, for `HybridCache.get_chain` and `longest_prefix`.

A page is usable only after every page before it, so what counts is the longest leading run a
chain has cached. Both reads ask each tier once (its bulk call where it has one, else key by
key), and each tier only about the pages the tiers above lacked: a chain of hundreds of pages
costs one round trip per tier, not one per page.
"""

from __future__ import annotations

from collections.abc import Sequence

from cache_runtime.metrics import CacheMetrics
from cache_runtime.tier_health import TierCalls
from cache_runtime.tiers.base import Tier


def read_leading_run(
    tiers: Sequence[Tier], call: TierCalls, metrics: CacheMetrics, keys: list[str]
) -> list[tuple[bytes, int]]:
    """(value, depth of the tier that held it) of each page in the longest run of leading
    `keys` cached, in order; hits and misses are counted per tier as "prefix" lookups."""
    found: list[tuple[bytes, int] | None] = [None] * len(keys)
    for depth, tier in enumerate(tiers):
        ask = [i for i, hit in enumerate(found) if hit is None]
        if not ask:
            break
        values = get_many(tier, call, [keys[i] for i in ask])
        hits = 0
        for i, value in zip(ask, values, strict=True):
            if value is not None:
                found[i], hits = (value, depth), hits + 1
        metrics.lookups.labels(tier.name, "prefix", "hit").inc(hits)
        metrics.lookups.labels(tier.name, "prefix", "miss").inc(len(ask) - hits)
    run = next((i for i, hit in enumerate(found) if hit is None), len(found))
    return [hit for hit in found[:run] if hit is not None]


def get_many(tier: Tier, call: TierCalls, keys: list[str]) -> list[bytes | None]:
    """`tier`'s values of `keys`: one `get_many` call where the tier has it, else one `get`
    per key; all None where the bulk call failed."""
    many = getattr(tier, "get_many", None)
    if not callable(many):
        return [call(tier, "get", tier.get, key) for key in keys]
    values = call(tier, "get", many, keys)
    return [None] * len(keys) if values is None else values


def held_run_length(tiers: Sequence[Tier], call: TierCalls, keys: list[str]) -> int:
    """How many leading `keys` some tier holds, asked with `contains_many` where the tier has
    it, else key by key."""
    held = [False] * len(keys)
    for tier in tiers:
        ask = [i for i, known in enumerate(held) if not known]
        if not ask:
            break
        many = getattr(tier, "contains_many", None)
        if callable(many):
            answers = call(tier, "contains", many, [keys[i] for i in ask]) or []
        else:
            answers = [call(tier, "contains", tier.contains, keys[i]) for i in ask]
        for i, answer in zip(ask, answers, strict=False):
            held[i] = bool(answer)
    return next((i for i, known in enumerate(held) if not known), len(held))

"""The memory tier's policies through the real tier on a prefix trace's KV pages.

`bench cache` replays a trace through each policy as a bare cache, where any key may go. The
memory tier holds KV pages under prefix closure (a page with cached children is never evicted:
`tiers.memory`), so on a prefix trace most cached pages are protected and a policy chooses among
the leaves. A policy that gives up when its first choices are protected makes the tier refuse
the put, which no replay shows: S3-FIFO did until 2026-12-06, and on the Mooncake trace at 20%
the tier refused 2,886 pages. Here every request's blocks are read in order from a `MemoryTier`
whose budget holds `size` x the trace's unique blocks; a block that misses is written with the
block before it as its parent (the tier refuses a page whose parent is not cached, so a hit is
always a page whose whole prefix is cached). Each policy runs alone, and the pool (`preheat`),
beside its own replay; no hints, as `bench cache`'s `preheat_no_hints`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cache_runtime.candidates import CANDIDATES
from cache_runtime.policies import EvictionPolicy
from cache_runtime.pool import PoolPolicy
from cache_runtime.simulator import replay
from cache_runtime.tiers.memory import MemoryTier
from cache_runtime.traces import AccessTrace

VALUE = b"\0" * 64  # a page's bytes: the budget counts pages, whatever their real size


def tier_hits(policy: EvictionPolicy, trace: AccessTrace, capacity: int) -> tuple[float, int]:
    """(hit ratio, pages refused): `trace`'s requests through a tier of `capacity` pages. A
    page counts as refused where its prefix was cached and the policy made no room for it;
    the rest of its prompt, refused for want of their parent, does not count again."""
    tier = MemoryTier(capacity * len(VALUE), policy=policy)
    blocks = [str(block) for block in trace.accesses.tolist()]
    ends = [*trace.request_starts.tolist()[1:], len(blocks)]
    hits = refused = 0
    start = 0
    for end in ends:
        parent = None
        for page in blocks[start:end]:
            if tier.get(page) is not None:
                hits += 1
            elif not tier.put(page, VALUE, parent=parent) and (
                parent is None or tier.contains(parent)
            ):
                refused += 1  # no room made: the pages after it are refused for want of it
            parent = page
        start = end
    return hits / max(1, len(blocks)), refused


def _policies() -> dict[str, Callable[[], EvictionPolicy]]:
    """The pool first, then each plain candidate (a hinted one gets no hints here: its twin)."""
    plain = {name: c.make for name, c in CANDIDATES.items() if not c.hinted}
    return {"preheat": PoolPolicy, **plain}


def bench_tier(trace: AccessTrace, sizes: list[float]) -> dict[str, Any]:
    """The JSON object of `benchmarks/tier_policy.py`."""
    started = time.perf_counter()
    unique = trace.unique
    out: dict[str, Any] = {"trace": trace.name, "accesses": len(trace.accesses), "unique": unique}
    out["sizes"] = {}
    for size in sizes:
        capacity = max(1, round(size * unique))
        row: dict[str, Any] = {"capacity": capacity, "policies": {}}
        for name, make in _policies().items():
            began = time.perf_counter()
            hit_ratio, refused = tier_hits(make(), trace, capacity)
            seconds = time.perf_counter() - began
            # the replay as `bench cache` runs it: the pool told the capacity (the tier learns it)
            policy = PoolPolicy(capacity=capacity) if name == "preheat" else make()
            bare = replay(policy, trace.accesses, trace.request_starts, capacity, hints=False)
            row["policies"][name] = {
                "tier": round(hit_ratio, 4),
                "replay": round(float(np.mean(bare)), 4),
                "refused_puts": refused,
                "tier_seconds": round(seconds, 1),
            }
        alone = {n: p["tier"] for n, p in row["policies"].items() if n != "preheat"}
        best = max(alone, key=alone.__getitem__)
        row["best_candidate_in_tier"] = best
        row["preheat_margin_to_best_candidate"] = round(
            row["policies"]["preheat"]["tier"] - alone[best], 4
        )
        out["sizes"][str(size)] = row
    out["refused_puts"] = sum(
        p["refused_puts"] for row in out["sizes"].values() for p in row["policies"].values()
    )
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out

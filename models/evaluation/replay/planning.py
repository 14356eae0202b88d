"""Warm-up plans sized to what the worker can deliver before the demand comes.

A plan is a queue the worker works through one block at a time, at modelled cost: a load from
the shared tier where it holds the block, else a recompute of its prefill. A block is worth its
place only if it arrives before it is first requested: one requested earlier is computed by the
request (the worker then skips it) and one requested after the window does not cut its TTFT.
So the same ranking makes a good plan for a fast worker and a poor one for a slow one — the
measured failure under GPU-like costs (40 ms per recompute): after the third Mooncake restart
the plan held 5,712 blocks, two minutes of work; the median requested block was still 1,852
places back in the queue when its request came, and items delivered after 30 s were 3% used.

The plan here:
1. candidates: blocks the long manifest expects at least `min_expected_uses` times in the
   window, whose whole prefix is a candidate too (or held): a prefix cache stops at the first
   miss, so a block behind a gap is never used;
2. queue order: Smith's rule on expected benefit per unit of worker time — P(requested within
   the retention) x urgency (the short manifest: how soon its value goes) x prefill saved /
   worker cost — so what loses value fastest per second of worker time goes first, and a
   cheap load from the shared tier before a recompute of equal value; a block never before
   its parent;
3. each item's expected arrival: the expected work queued before it (an item requested before
   the worker reaches it is skipped at no cost) plus its own; its P(used) = P(first request
   after the arrival, within the retention), from the `DemandModel`, and never above its
   parent's;
4. the kept items: P(used) at least `min_use_probability`, the largest set whose mean meets
   `target_precision` (`select_for_precision`), no more than the tiers hold, parents with
   their children; a few rounds, since dropping an item brings the later ones forward.

Measured on Mooncake (memory 0.05, SSD 0.2, restarts every 300 s): under GPU-like costs 71% of
the restore reference's cut at precision 0.57 (before: 55% at 0.33); with tiny-GPT-2 costs
measured on CPU 174% at 0.54 (before: 124% at 0.54).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from models.evaluation.replay.demand import DemandModel, cells
from models.evaluation.replay.warming import HeatManifest, WarmWorker, select_for_precision

if TYPE_CHECKING:
    from models.evaluation.replay.engine import ReplayConfig
    from models.evaluation.replay.node import Node

ROUNDS = 3


def chain_min(values: np.ndarray, up: np.ndarray) -> np.ndarray:
    """(C,) the least of `values` (C,) over each item and all the items above it, `up` (C,)
    naming each one's parent (itself at the top); by pointer jumping, log2(depth) steps."""
    values, up = values.copy(), up.copy()
    while True:
        values = np.minimum(values, values[up])
        higher = up[up]
        if np.array_equal(higher, up):
            return values
        up = higher


def deliverable(
    cost_s: np.ndarray, survival: Callable[[np.ndarray], np.ndarray], retention_s: float,
    target: float | None, floor: float = 0.0, up: np.ndarray | None = None,
    capacity: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(kept positions, P(used) of every candidate) for a queue in the given order.

    `cost_s` (C,) worker seconds of each candidate in queue order; `survival(delays)` (C,) ->
    (C,) each one's P(no request within its delay). An item is used if its first request comes
    after it arrives and within `retention_s`. Only items with P(used) >= `floor` are kept;
    with a `target`, the largest set of them whose mean P(used) meets it. `up` (C,): each
    one's parent block among the candidates (itself where none is needed): a prefix cache uses
    a block only behind its parent, so none is worth more than its parent, and none is kept
    without it. `capacity`: the most items kept (the likeliest used), what the tiers hold.
    """
    keep = np.ones(len(cost_s), dtype=bool)
    used = np.zeros(len(cost_s))
    end = survival(np.full(len(cost_s), retention_s))  # (C,) never requested in the retention
    for _ in range(ROUNDS):
        work = np.where(keep, cost_s, 0.0)
        start = np.cumsum(work) - work  # (C,) worker time before each item, skips ignored
        work = work * survival(start)  # an item requested before the worker gets to it: skipped
        arrive = np.cumsum(work) - work + cost_s  # (C,)
        used = np.where(arrive < retention_s, np.maximum(survival(arrive) - end, 0.0), 0.0)
        if up is not None:
            used = chain_min(used, up)
        possible = np.flatnonzero((used > 0) & (used >= floor))
        chosen = (
            possible if target is None else possible[select_for_precision(used[possible], target)]
        )
        if capacity is not None and len(chosen) > capacity:
            chosen = chosen[np.argsort(-used[chosen], kind="stable")[:capacity]]
        keep = np.zeros(len(cost_s), dtype=bool)
        keep[chosen] = True
        if up is not None:
            keep = chain_min(keep, up)
    return np.flatnonzero(keep), used


def ranked(
    worker: WarmWorker, node: Node, demand: DemandModel, manifests: tuple[HeatManifest, ...],
    now: float, config: ReplayConfig, capacity: int, candidates: np.ndarray | None = None,
    tier: str = "ssd",
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(blocks to queue at `now` in queue order, each one's P(used)); see the module docstring.

    `capacity`: the most blocks queued (what the tiers they go to hold); `candidates` limits
    the blocks considered (None: every block); `tier` is where they go (the prefill saved is
    the recompute less that tier's load).
    """
    long, short = manifests
    expected = long.expected_uses(now, demand.window_s)  # (n_blocks,)
    worth = np.flatnonzero(expected >= config.min_expected_uses)
    if candidates is not None:
        worth = np.intersect1d(worth, candidates)
    up, whole = _links(worth, worker.parents, node, worker.keys)  # (C,), (C,)
    # keep the candidates with no gap above them; a kept one's parent is kept or held, so its
    # link maps onto the kept positions
    position = np.cumsum(whole) - 1  # (C,) old position -> position among the kept
    worth, up = worth[whole], position[up[whole]]
    if not worth.size:
        return worth, np.zeros(0)
    urgency = short.expected_uses(now, demand.window_s)[worth]  # (C,)
    cell = cells(expected[worth], urgency)  # (C,)
    requested = 1 - demand.survival(cell, np.full(len(worth), demand.retention_s))
    cost_ms = worker.costs_ms(node, worth)  # (C,)
    saved_ms = np.maximum(
        worker.latency.prefill_ms(worker.tokens[worth].astype(float))
        - worker.latency.load_ms_per_block.get(tier, 0.0),
        0.0,
    )
    priority = requested * urgency * saved_ms / np.maximum(cost_ms, 1e-9)  # (C,)
    # parents first: a child never outranks its parent, and ties go to the shallower block
    priority = chain_min(priority, up)
    order = np.lexsort((_depths(up), -priority))  # (C,) queue position -> candidate
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))  # candidate -> queue position
    kept, used = deliverable(
        cost_ms[order] / 1000, lambda delays: demand.survival(cell[order], delays),
        demand.retention_s, config.target_precision, config.min_use_probability,
        up=rank[up[order]], capacity=capacity,
    )  # fmt: skip
    return worth[order[kept]], used[kept]


def _links(
    worth: np.ndarray, parents: np.ndarray, node: Node, keys: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """((C,) position in `worth` of each candidate's parent, itself at a root or where the node
    holds the parent; (C,) whether every ancestor is a candidate or held: a prefix cache stops
    at the first miss, so a block behind a gap could not be used)."""
    position = {block: i for i, block in enumerate(worth.tolist())}
    up, whole = np.arange(len(worth)), np.ones(len(worth), dtype=bool)
    for i, parent in enumerate(parents[worth].tolist()):
        if parent < 0:
            continue
        if parent in position:
            up[i] = position[parent]
        elif not node.holds_locally(keys[parent]):
            whole[i] = False
    return up, chain_min(whole, up)


def _depths(up: np.ndarray) -> np.ndarray:
    """(C,) how many items lie above each one (0 at a top), `up` as in `chain_min`."""
    depth = (up != np.arange(len(up))).astype(np.int64)  # hops to `up`, doubled each step
    while True:
        higher = up[up]
        depth = depth + depth[up]
        if np.array_equal(higher, up):
            return depth
        up = higher


def plan_warmup(
    worker: WarmWorker, node: Node, demand: DemandModel, manifests: tuple[HeatManifest, ...],
    now: float, config: ReplayConfig, memory_blocks: int, ssd_blocks: int,
) -> None:  # fmt: skip
    """After a restart: rehydrate the blocks expected to be asked for after they arrive.

    Most go to the SSD: the memory tier turns over in seconds under new prompts, so a block
    warmed there is often evicted before its request comes; the SSD keeps it for minutes and
    its load still costs a fraction of a prefill.
    """
    demand.advance(now)
    in_memory = round(config.memory_share * memory_blocks)
    queue, p_used = ranked(worker, node, demand, manifests, now, config, in_memory + ssd_blocks)
    worker.plan(node, now, queue, in_memory, manifests[0].heat_at(now), p_used)


def plan_ahead(
    worker: WarmWorker, node: Node, demand: DemandModel, manifests: tuple[HeatManifest, ...],
    now: float, config: ReplayConfig, ssd_blocks: int,
) -> None:  # fmt: skip
    """During normal running: warm predicted-hot blocks the node lost (into the SSD, so the hot
    set in memory is not displaced by a forecast); skipped while a rehydration is still queued."""
    if worker.queue:
        return
    demand.advance(now)
    expected = manifests[0].expected_uses(now, demand.window_s)
    seen = np.flatnonzero(expected >= config.min_expected_uses)
    missing = np.array(
        [b for b in seen.tolist() if not node.holds_locally(worker.keys[b])], dtype=np.int64
    )
    queue, p_used = ranked(
        worker, node, demand, manifests, now, config, ssd_blocks, candidates=missing
    )
    worker.plan(node, now, queue, 0, manifests[0].heat_at(now), p_used)

"""Warm-up inside the replay: a heat manifest of the past, and a worker whose work takes time.

The manifest is what the platform keeps outside the node (in the shared tier, or the lake): the
decayed request count of every block seen so far — the same heat the cache runtime ranks by
(`cache_runtime.heat`), here over arrays so a manifest of the whole trace costs microseconds per
request. It only ever sees requests already replayed, so it forecasts from the past.

A block is a candidate for warming when its heat predicts at least `min_expected_uses` requests
within the window (which candidates are warmed, and in what order, is `planning`'s call): for a
key requested at rate r, the decayed count approaches r x half-life / ln 2, so
r ~= heat x ln 2 / half-life. Rejected: warming the top N blocks by heat whatever their heat,
which fills the tiers with blocks seen once long ago (low precision, and it evicts nothing
useful only because the node is empty — the ahead-of-demand warm-ups during normal running
would evict).

`WarmWorker` does the warming sequentially at modelled cost — loading the block from the shared
tier when it has it, else recomputing its prefill — so after a restart items arrive one by one
and early requests still miss; that is the honest version of "rehydration".
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from models.evaluation.replay.latency import ReplayLatency
from models.evaluation.replay.node import Node


class HeatManifest:
    """Decayed request counts per block (by index into the trace's unique blocks)."""

    def __init__(self, n_blocks: int, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.half_life_s = half_life_s
        self.rate = math.log(2) / half_life_s
        self.heat = np.zeros(n_blocks)
        self.last = np.zeros(n_blocks)

    def bump(self, blocks: np.ndarray, now: float) -> None:
        """Count one request of each of `blocks` (distinct indices) at `now`."""
        self.heat[blocks] = self.heat[blocks] * np.exp(-self.rate * (now - self.last[blocks])) + 1
        self.last[blocks] = now

    def heat_at(self, now: float) -> np.ndarray:
        """(n_blocks,) decayed request counts at `now`."""
        return self.heat * np.exp(-self.rate * (now - self.last))

    def expected_uses(self, now: float, horizon_s: float) -> np.ndarray:
        """(n_blocks,) requests each block is expected to get in the next `horizon_s`."""
        return self.heat_at(now) * self.rate * horizon_s


def select_for_precision(probability: np.ndarray, target: float) -> np.ndarray:
    """Indices of the largest set, most probable first, whose mean use probability (the
    expected warm-up precision) is at least `target`; empty when even the best falls short."""
    order = np.argsort(-probability, kind="stable")
    running_mean = np.cumsum(probability[order]) / np.arange(1, len(order) + 1)
    keep = np.flatnonzero(running_mean >= target)
    return order[: keep[-1] + 1] if keep.size else order[:0]


@dataclass
class WarmItem:
    block: int  # index of the block
    tier: str  # where it goes: "memory" or "ssd"
    heat: float  # the manifest's decayed request count, handed to the SSD's admission
    p_used: float = 0.0  # the plan's predicted chance that it is used


class WarmWorker:
    """Sequential warm-up at modelled cost; counts items, their cost and how many were used, and
    how many the plans expected to be used (their summed P(used)): the model's own check."""

    def __init__(
        self,
        keys: list[str],
        parents: np.ndarray,
        tokens: np.ndarray,
        latency: ReplayLatency,
        value: bytes,
    ) -> None:
        self.keys, self.parents, self.tokens = keys, parents, tokens
        self.latency, self.value = latency, value
        self.queue: deque[WarmItem] = deque()
        self.busy_until = 0.0
        self.items = 0
        self.cost_s = 0.0
        self.used = 0
        self.expected_used = 0.0  # sum of the delivered items' P(used) when planned
        self.warmed = np.zeros(len(keys), dtype=bool)  # warmed and not yet used or recomputed

    def plan(
        self, node: Node, now: float, ranked: np.ndarray, memory_slots: int, heat: np.ndarray,
        p_used: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """Queue `ranked` blocks (best first); the first `memory_slots` go to memory, the rest to
        the SSD. Replaces any plan still queued: a newer manifest knows better. `p_used` (R,):
        each one's predicted chance of use, summed over the delivered ones."""
        self.queue.clear()
        self.busy_until = max(self.busy_until, now)
        names = node.tier_names
        chances = np.zeros(len(ranked)) if p_used is None else p_used
        pairs = zip(ranked.tolist(), chances.tolist(), strict=True)
        for position, (block, chance) in enumerate(pairs):
            tier = "memory" if position < memory_slots and "memory" in names else "ssd"
            if tier not in names:
                continue
            self.queue.append(WarmItem(block, tier, float(heat[block]), chance))

    def advance(self, node: Node, now: float) -> None:
        """Do every queued item that finishes by `now`, in order."""
        while self.queue:
            item = self.queue[0]
            key = self.keys[item.block]
            if node.holds_locally(key):  # a request computed it meanwhile: nothing to do
                self.queue.popleft()
                continue
            cost_ms = self._cost_ms(node, key, item.block)
            if self.busy_until + cost_ms / 1000 > now:
                break
            self.queue.popleft()
            self.busy_until += cost_ms / 1000
            self.cost_s += cost_ms / 1000
            if self._store(node, item, key):
                self.items += 1
                self.expected_used += item.p_used
                self.warmed[item.block] = True

    def costs_ms(self, node: Node, blocks: np.ndarray) -> np.ndarray:
        """(n,) modelled worker time of each of `blocks` (n,): a load from the shared tier where
        it holds the block, else a recompute of its prefill."""
        prefill = self.latency.prefill_ms(self.tokens[blocks].astype(float))
        if "redis" not in node.tier_names:
            return prefill
        held = node.tier("redis").contains_many([self.keys[b] for b in blocks.tolist()])
        return np.where(held, self.latency.load_ms_per_block.get("redis", 0.0), prefill)

    def _cost_ms(self, node: Node, key: str, block: int) -> float:
        if "redis" in node.tier_names and node.tier("redis").contains(key):
            return self.latency.load_ms_per_block.get("redis", 0.0)
        return self.latency.prefill_ms(int(self.tokens[block]))

    def _store(self, node: Node, item: WarmItem, key: str) -> bool:
        parent = int(self.parents[item.block])
        tier = node.tier(item.tier)
        if item.tier == "memory":
            parent_key = self.keys[parent] if parent >= 0 else None
            if parent_key is not None and not tier.contains(parent_key):
                parent_key = None  # the parent lives in a lower tier: no closure link to keep
            return bool(tier.put(key, self.value, parent=parent_key))
        return bool(tier.put(key, self.value, heat=item.heat))

    def note_use(self, block: int) -> None:
        """A request hit `block`: if it was warmed, the warm-up paid off."""
        if self.warmed[block]:
            self.used += 1
            self.warmed[block] = False

    def note_recomputed(self, block: int) -> None:
        """A request had to compute `block`: a warmed copy, if any, was evicted unused."""
        self.warmed[block] = False

    def forget_local(self) -> None:
        """A restart: warmed blocks still unused are lost with the node's tiers."""
        self.warmed[:] = False
        self.queue.clear()

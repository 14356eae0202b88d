"""Warm-up inside the replay: a heat manifest of the past, and a worker whose work takes time.

The manifest is what the platform keeps outside the node (in the shared tier, or the lake): the
decayed request count of every block seen so far — the same heat the cache runtime ranks by
(`cache_runtime.heat`), here over arrays so a manifest of the whole trace costs microseconds per
request. It only ever sees requests already replayed, so it forecasts from the past.

A block is worth warming when its heat predicts at least `min_expected_uses` requests within the
horizon: for a key requested at rate r, the decayed count approaches r x half-life / ln 2, so
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

from flows.replay.latency import ReplayLatency
from flows.replay.node import Node


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


class PrecisionController:
    """Moves the warm-worthiness threshold so that realised precision tracks a target.

    How many expected uses make a block worth warming is a property of the traffic (how bursty,
    how long sessions last), not a constant: a threshold measured on one trace is a guess on the
    next. After each restart's warm-up has had its cycle, the share of its items that were used
    is known; the threshold rises by `step` when that share fell short of `target` and falls by
    `step` when it beat the target by more than `slack` (more warming buys more hits), within
    `bounds`. A cycle with fewer than `min_items` items says too little to move it.
    """

    def __init__(
        self, target: float, threshold: float, step: float = 1.25, slack: float = 0.15,
        bounds: tuple[float, float] = (0.05, 16.0), min_items: int = 20,
    ) -> None:  # fmt: skip
        if not 0 < target < 1 or step <= 1 or slack < 0 or threshold <= 0:
            raise ValueError("need 0 < target < 1, step > 1, slack >= 0 and threshold > 0")
        self.target, self.step, self.slack = target, step, slack
        self.bounds, self.min_items = bounds, min_items
        self.threshold = threshold
        self.history: list[tuple[int, float, float]] = []  # (items, precision, new threshold)

    def update(self, items: int, used: int) -> float:
        """The last cycle warmed `items`, of which `used` were used; returns the new threshold."""
        if items >= self.min_items:
            precision = used / items
            if precision < self.target:
                self.threshold *= self.step
            elif precision > self.target + self.slack:
                self.threshold /= self.step
            self.threshold = min(max(self.threshold, self.bounds[0]), self.bounds[1])
            self.history.append((items, round(precision, 4), round(self.threshold, 4)))
        return self.threshold


@dataclass
class WarmItem:
    block: int  # index of the block
    tier: str  # where it goes: "memory" or "ssd"
    heat: float  # the manifest's decayed request count, handed to the SSD's admission


class WarmWorker:
    """Sequential warm-up at modelled cost; counts items, their cost and how many were used."""

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
        self.warmed = np.zeros(len(keys), dtype=bool)  # warmed and not yet used or recomputed

    def plan(
        self, node: Node, now: float, ranked: np.ndarray, memory_slots: int, heat: np.ndarray
    ) -> None:
        """Queue `ranked` blocks (best first); the first `memory_slots` go to memory, the rest to
        the SSD. Replaces any plan still queued: a newer manifest knows better."""
        self.queue.clear()
        self.busy_until = max(self.busy_until, now)
        names = node.tier_names
        for position, block in enumerate(ranked.tolist()):
            tier = "memory" if position < memory_slots and "memory" in names else "ssd"
            if tier not in names:
                continue
            self.queue.append(WarmItem(block, tier, float(heat[block])))

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
                return
            self.queue.popleft()
            self.busy_until += cost_ms / 1000
            self.cost_s += cost_ms / 1000
            if self._store(node, item, key):
                self.items += 1
                self.warmed[item.block] = True

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

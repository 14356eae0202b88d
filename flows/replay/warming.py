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


class UseCalibration:
    """P(a warmed block is used within the horizon | its expected uses λ in that horizon).

    The manifest's λ is a rate estimate from the past; how often a block warmed at λ is really
    used depends on the traffic (how bursty, how long sessions last), so the mapping is learned
    online from the replay's own warmed items. Every item resolves at a fixed deadline — used
    within the horizon λ was computed for, or not — so successes and failures are counted
    alike (resolving only on a hit or a recompute would count most hits and miss most unused
    items, which just sit in the SSD: measured, 96% "used"). Each bin of λ starts from the
    Poisson prior 1 - exp(-λ) worth `prior_weight` items, so early plans are sane and the
    evidence takes over as it comes.
    """

    EDGES = np.array([0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0])

    def __init__(self, prior_weight: float = 5.0) -> None:
        self.prior_weight = prior_weight
        self.used = np.zeros(len(self.EDGES) + 1)  # (bins,)
        self.total = np.zeros(len(self.EDGES) + 1)  # (bins,)

    def record(self, expected: np.ndarray, used: bool) -> None:
        """Warmed blocks with these λ (at warm time) resolved as used or lost."""
        bins = np.searchsorted(self.EDGES, np.asarray(expected, dtype=float), side="right")
        np.add.at(self.total, bins, 1)
        if used:
            np.add.at(self.used, bins, 1)

    def probability(self, expected: np.ndarray) -> np.ndarray:
        """(n,) calibrated use probability for each λ in `expected` (n,)."""
        lam = np.asarray(expected, dtype=float)
        bins = np.searchsorted(self.EDGES, lam, side="right")
        prior = 1.0 - np.exp(-lam)
        k = self.prior_weight
        return (self.used[bins] + k * prior) / (self.total[bins] + k)


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
        self.expected = np.zeros(len(keys))  # (n_blocks,) each queued block's λ when planned
        self.horizon_s = 0.0  # the horizon the current plan's λ are for
        self.calibration = UseCalibration()
        self.pending = np.zeros(len(keys), dtype=bool)  # warmed, use within horizon not yet known
        self.deadlines: deque[tuple[float, int]] = deque()  # (resolve by, block), in warm order

    def plan(
        self, node: Node, now: float, ranked: np.ndarray, memory_slots: int, heat: np.ndarray,
        expected: np.ndarray | None = None, horizon_s: float = 0.0,
    ) -> None:  # fmt: skip
        """Queue `ranked` blocks (best first); the first `memory_slots` go to memory, the rest to
        the SSD. Replaces any plan still queued: a newer manifest knows better. `expected`
        (n_blocks,) is the manifest's λ for `horizon_s`, remembered to calibrate on the outcome
        (without it, the items are not calibrated on)."""
        self.queue.clear()
        self.horizon_s = horizon_s if expected is not None else 0.0
        if expected is not None:
            self.expected[ranked] = expected[ranked]
        self.busy_until = max(self.busy_until, now)
        names = node.tier_names
        for position, block in enumerate(ranked.tolist()):
            tier = "memory" if position < memory_slots and "memory" in names else "ssd"
            if tier not in names:
                continue
            self.queue.append(WarmItem(block, tier, float(heat[block])))

    def advance(self, node: Node, now: float) -> None:
        """Do every queued item that finishes by `now`, in order; resolve expired items."""
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
                self.warmed[item.block] = True
                if self.horizon_s > 0:
                    self.pending[item.block] = True
                    self.deadlines.append((self.busy_until + self.horizon_s, item.block))
        self._resolve_expired(now)

    def _resolve_expired(self, now: float) -> None:
        """Items whose horizon has passed unused resolve as not used (for the calibration)."""
        while self.deadlines and self.deadlines[0][0] <= now:
            _, block = self.deadlines.popleft()
            if self.pending[block]:
                self.pending[block] = False
                self.calibration.record(self.expected[block : block + 1], used=False)

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
        if self.pending[block]:  # used within the horizon its λ was for
            self.pending[block] = False
            self.calibration.record(self.expected[block : block + 1], used=True)

    def note_recomputed(self, block: int) -> None:
        """A request had to compute `block`: a warmed copy, if any, was evicted unused."""
        if self.pending[block]:
            self.pending[block] = False
            self.calibration.record(self.expected[block : block + 1], used=False)
        self.warmed[block] = False

    def forget_local(self) -> None:
        """A restart: warmed blocks still unused are lost with the node's tiers."""
        self.calibration.record(self.expected[self.pending], used=False)
        self.pending[:] = False
        self.deadlines.clear()
        self.warmed[:] = False
        self.queue.clear()

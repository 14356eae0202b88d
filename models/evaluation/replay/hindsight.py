"""The warm-up plan of hindsight: what the replay's worker could recover if it knew the future.

A plan after a restart can fall short of the restore reference for two reasons: the worker is
too slow to rebuild what the first minutes ask for (one block at a time, at a prefill's cost),
or the plan does not know which blocks come back first. `HindsightPlanner` takes the second
away: at each restart it is handed the blocks the trace really asks for next (within the
retention), in the order of their first request (earliest deadline first), and keeps each one
that the worker, at its modelled costs and after the ones kept before it, delivers before that
request. Run through the same worker as the real plan (`replay_arm(planner=...)`), what it
recovers shows what this worker can deliver when the plan knows which blocks come back first:
the real plan's distance to it is the forecast's, not the worker's speed.

It is a heuristic of hindsight, not a ceiling. For blocks of equal cost (a trace's blocks are,
but for a prompt's last partial one) the greedy delivers as many blocks in time as any order
could (Moore and Hodgson's rule for unit jobs), but a block saved early, in the burst that fills
the queue, is worth more than one saved later, and the rule counts them alike. It also counts a
block whose parent an earlier request asked for as usable, while that parent may have been
evicted by then (on Mooncake at 2x the plan among blocks seen before the restart recovers more
than the whole one, 76% against 68%). Its items all go to the SSD tier, as most of the real
plan's do, and the memory tier's share (`memory_share`) is not used.

`seen_only`: only blocks asked for before the restart, the most a manifest of the past could
ever name (a block first asked for after the restart is new to every forecast).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from cache_runtime.traces import AccessTrace
from models.evaluation.replay.engine import (
    PreparedTrace,
    ReplayConfig,
    comparison_configs,
    replay_arm,
    replay_arms,
    request_times,
    scale_load,
)
from models.evaluation.replay.latency import ReplayLatency
from models.evaluation.replay.summary import (
    after_restart_mask,
    recovered,
    restart_windows_ms,
    warmup_figures,
    window_stats,
)

if TYPE_CHECKING:
    from models.evaluation.replay.demand import DemandModel
    from models.evaluation.replay.node import Node
    from models.evaluation.replay.warming import HeatManifest, WarmWorker

# the arms whose warm-up is scored against the restore reference's cut
WARM_ARMS = ("on", "hindsight", "hindsight_seen")


class HindsightPlanner:
    """A drop-in for `planning.plan_warmup` that reads the trace's future (see the module)."""

    def __init__(self, prepared: PreparedTrace, seen_only: bool = False) -> None:
        self.prepared, self.seen_only = prepared, seen_only
        self.times = request_times(prepared.trace)  # (R,) arrival of each request, s
        self.bounds = np.append(prepared.trace.request_starts, len(prepared.trace.accesses))

    def __call__(
        self, worker: WarmWorker, node: Node, demand: DemandModel,
        manifests: tuple[HeatManifest, ...], now: float, config: ReplayConfig,
        memory_blocks: int, ssd_blocks: int,
    ) -> None:  # fmt: skip
        """Queue the blocks first asked for in [now, now + retention) that the worker delivers
        in time, earliest first, into the SSD (as the real plan puts most of its items)."""
        seen = manifests[0].heat > 0 if self.seen_only else None
        blocks, deadlines, requests = self.first_requests(now, now + config.retention, seen)
        cost_s = worker.costs_ms(node, blocks) / 1000  # (B,)
        kept = in_time(blocks, deadlines, requests, cost_s, self.prepared.parents,
                       max(worker.busy_until, now))  # fmt: skip
        chosen = blocks[kept][:ssd_blocks]
        worker.plan(node, now, chosen, 0, manifests[0].heat_at(now), np.ones(len(chosen)))

    def first_requests(
        self, start: float, end: float, seen: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """((B,) blocks first asked for in [start, end) in the order of that first request,
        (B,) its arrival, (B,) its index); `seen` (n_blocks,) limits them to the True ones."""
        first, last = np.searchsorted(self.times, [start, end])
        accesses = self.prepared.blocks[self.bounds[first] : self.bounds[last]]  # (A,)
        request = np.repeat(np.arange(first, last), np.diff(self.bounds[first : last + 1]))
        blocks, at = np.unique(accesses, return_index=True)  # first access of each
        order = np.argsort(at, kind="stable")  # in trace order: parents before children
        blocks, requests = blocks[order], request[at[order]]
        if seen is not None:
            keep = seen[blocks]
            blocks, requests = blocks[keep], requests[keep]
        return blocks, self.times[requests], requests


def in_time(
    blocks: np.ndarray, deadlines: np.ndarray, requests: np.ndarray, cost_s: np.ndarray,
    parents: np.ndarray, start: float,
) -> np.ndarray:  # fmt: skip
    """(B,) which of `blocks` (B,), in deadline order, a sequential worker free from `start`
    delivers before their `deadlines` (B,) at `cost_s` (B,) each, skipping those it cannot.

    A block whose parent (`parents`, by block) is first asked for by the same request is kept
    only behind a kept parent: that request misses the parent, and a prefix cache stops there.
    """
    kept = np.zeros(len(blocks), dtype=bool)
    taken: set[int] = set()
    first_request = dict(zip(blocks.tolist(), requests.tolist(), strict=True))
    busy = start
    for i, block in enumerate(blocks.tolist()):
        parent = int(parents[block])
        if parent >= 0 and parent not in taken and first_request.get(parent) == requests[i]:
            continue
        if busy + cost_s[i] <= deadlines[i]:
            busy += cost_s[i]
            kept[i] = True
            taken.add(block)
    return kept


def warmup_hindsight(
    trace: AccessTrace, config: ReplayConfig, latency: ReplayLatency
) -> dict[str, Any]:
    """The comparison of `preheat replay` at `config.load` with two more arms, warm-up planned
    in hindsight (`hindsight`) and in hindsight among blocks seen before the restart
    (`hindsight_seen`): each arm's after-restart TTFT, and the share of the restore
    reference's cut of it that each warm arm recovers, at P95 and on the mean."""
    scaled = scale_load(trace, config.load)
    prepared = PreparedTrace.build(scaled)
    arms = replay_arms(prepared, comparison_configs(config, both=True), latency)
    warm = replace(config, warmup=True)
    for name, seen_only in (("hindsight", False), ("hindsight_seen", True)):
        planner = HindsightPlanner(prepared, seen_only)
        arms[name] = replay_arm(prepared, warm, latency, planner=planner)
    restarts = arms["off"].restarts
    after = after_restart_mask(request_times(scaled), restarts, config.window_s)
    windows = restart_windows_ms(restarts, config.window_s)
    stats = {name: window_stats(arm, after, windows) for name, arm in arms.items()}
    ttft = {name: {q: s["ttft_ms"][q] for q in ("p95", "mean")} for name, s in stats.items()}
    warmed = {name: warmup_figures(arms[name], warm) for name in WARM_ARMS}
    return {
        "load": config.load,
        "restarts": len(restarts),
        "after_restart_ttft_ms": ttft,
        "recovered": {
            name: {
                stat: recovered(ttft["off"][stat], ttft[name][stat], ttft["reference"][stat])
                for stat in ("p95", "mean")
            }
            for name in WARM_ARMS
        },
        "warmup": {
            name: {k: figures[k] for k in ("items", "precision", "cost_s")}
            for name, figures in warmed.items()
        },
        "utilisation_after_restart": {
            name: s["utilisation"] if windows else None for name, s in stats.items()
        },
    }

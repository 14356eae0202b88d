"""The warm-up plan: which candidates to warm, into which tier, in which order, and why.

The rules, in the order the planner applies them:

1. **Value.** score = predicted_hits x latency_saved_s: the seconds of user latency an item saves
   over the horizon. An item with score 0 is not warmed.
2. **Closure.** A child is considered only after its parent (its rank is its effective density:
   the lowest score-per-byte along its parent chain) and is dropped when its parent is dropped,
   so a plan never holds a KV page whose earlier pages it lacks. Rejected: ranking a parent and
   its children as one bundle by their combined density (better packing, but a knapsack with
   precedence constraints needs a sequential search, not a sort).
3. **Tiers.** In that rank order items fill memory until the next one does not fit, then SSD
   from there, then Redis (when its budget is above 0): the densest value sits in the fastest
   tier. Items that fit nowhere are then tried once more, in rank order, against what each tier
   has left (backfill), never in a tier faster than their parent's (the memory tier refuses a
   KV page whose parent page it does not hold).
4. **Compute and deadline.** Items are produced one after another on the node, so the last one
   finishes at the sum of the planned compute_s: selection stops adding items at
   min(compute budget, deadline), hence nothing finishes after `deadline_s`. An item's own
   `needed_in_s` is not a hard limit: one ready after its first predicted request still serves
   the requests after that, so it stays in and its reason says how late it is.
5. **Order.** Execution order is priority, moved earlier where a parent must precede: priority is
   smaller needed_in_s (the SLA countdown) first, then larger fanout (more keys wait on it), then
   higher score; a parent runs at the priority of its most urgent descendant, just before it.

Everything is vectorised over sorted arrays except the backfill, which loops only over the
items that could still fit somewhere.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
from pandera.typing import DataFrame

from data_contracts import WarmupCandidate, WarmupPlan
from data_contracts.warmup import TIERS
from models.warmup.candidates import CandidateOptions, CostModel, build_candidates
from models.warmup.explain import excluded_table, exclusion_labels, planned_reasons, summarise

__all__ = [
    "Budgets",
    "CandidateOptions",
    "CostModel",
    "PlanResult",
    "build_candidates",
    "plan_warmup",
]

MAX_DEPTH = 64
TOP_EXCLUDED = 20
MB = 1_000_000  # the unit of the byte budgets users give (`--memory-mb`, the flow's `memory_mb`)
# The selection sums compute in rank order, the schedule in execution order; a relative margin
# far below any real second keeps the two float sums from disagreeing about the deadline.
_SUM_MARGIN = 1e-9


@dataclass(frozen=True)
class Budgets:
    """What one warm-up may use: bytes per tier, compute seconds, and the wall-clock deadline."""

    memory_bytes: int
    ssd_bytes: int
    redis_bytes: int
    compute_s: float
    deadline_s: float

    def __post_init__(self) -> None:
        for field_, value in zip(fields(self), astuple(self), strict=True):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{field_.name} must be finite and >= 0, got {value!r}")

    @classmethod
    def from_mb(
        cls, memory_mb: float, ssd_mb: float, redis_mb: float, compute_s: float, deadline_s: float
    ) -> Budgets:
        """The budgets with the tiers in MB (10^6 bytes), as the CLI and the flow take them."""
        return cls(
            memory_bytes=int(memory_mb * MB), ssd_bytes=int(ssd_mb * MB),
            redis_bytes=int(redis_mb * MB), compute_s=compute_s, deadline_s=deadline_s,
        )  # fmt: skip

    @property
    def tier_bytes(self) -> tuple[int, int, int]:
        """Bytes per tier in `TIERS` order (memory, ssd, redis)."""
        return (int(self.memory_bytes), int(self.ssd_bytes), int(self.redis_bytes))

    @property
    def compute_limit_s(self) -> float:
        """Sequential production: the plan's last finish is its total compute."""
        return min(self.compute_s, self.deadline_s)

    @property
    def compute_reason(self) -> str:
        """What to call running out of compute: whichever of the two limits binds."""
        if self.compute_s <= self.deadline_s:
            return "compute budget"
        return "would finish after the deadline"


@dataclass
class PlanResult:
    """The plan, the best candidates left out (with why), and a summary."""

    plan: DataFrame[WarmupPlan]
    excluded: pd.DataFrame
    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """{"summary", "items", "excluded"} with only JSON types (no NA, no numpy scalars)."""
        return {
            "summary": self.summary,
            "items": _records(self.plan),
            "excluded": _records(self.excluded),
        }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    objects = frame.astype(object)
    return objects.where(frame.notna(), None).to_dict("records")


@dataclass
class _Graph:
    """Candidate rows' parent row (-1: none) and depth (0: no parent)."""

    parent: np.ndarray
    depth: np.ndarray

    @property
    def children(self) -> np.ndarray:
        return np.flatnonzero(self.parent >= 0)

    def down(self, values: np.ndarray, combine: Any) -> np.ndarray:
        """`combine` each row's value with its parent's, from the roots down."""
        out = values.copy()
        child = self.children
        for _ in range(int(self.depth.max(initial=0))):
            out[child] = combine(out[child], out[self.parent[child]])
        return out


def _graph(frame: pd.DataFrame) -> _Graph:
    items = pd.MultiIndex.from_arrays([frame["tenant"], frame["item"]])
    parent = items.get_indexer(pd.MultiIndex.from_arrays([frame["tenant"], frame["parent"]]))
    depth = np.zeros(len(frame), dtype="int64")
    child = np.flatnonzero(parent >= 0)
    for _ in range(MAX_DEPTH + 1):
        deeper = depth.copy()
        deeper[child] = depth[parent[child]] + 1
        if np.array_equal(deeper, depth):
            return _Graph(parent, depth)
        depth = deeper
    raise ValueError(f"candidate parents form a cycle or a chain deeper than {MAX_DEPTH}")


@dataclass
class _Room:
    """What the tiers and the compute budget have left while items are chosen."""

    bytes: np.ndarray  # (3,) int64, TIERS order
    compute_s: float


def _fill_tiers(
    rank: np.ndarray, size: np.ndarray, cost: np.ndarray, parent: np.ndarray, room: _Room
) -> np.ndarray:
    """Tier of each row (-1: not placed): the prefix fill of each tier in `rank` order, then
    the backfill."""
    tier = np.full(len(size), -1, dtype="int64")
    start = 0
    for t in range(len(TIERS)):
        if room.bytes[t] <= 0:
            continue
        rest = rank[start:]
        cum_bytes, cum_cost = np.cumsum(size[rest]), np.cumsum(cost[rest])
        fit_bytes = int(np.searchsorted(cum_bytes, room.bytes[t], side="right"))
        fit_cost = int(np.searchsorted(cum_cost, room.compute_s, side="right"))
        fit = min(fit_bytes, fit_cost)
        tier[rest[:fit]] = t
        if fit:
            room.bytes[t] -= cum_bytes[fit - 1]
            room.compute_s -= float(cum_cost[fit - 1])
        start += fit
        if fit_cost <= fit_bytes:  # compute ran out before this tier's bytes did
            break
    _backfill(rank[start:], tier, size, cost, parent, room)
    return tier


def _backfill(
    rest: np.ndarray,
    tier: np.ndarray,
    size: np.ndarray,
    cost: np.ndarray,
    parent: np.ndarray,
    room: _Room,
) -> None:
    """First fit, in rank order, of what the prefix fill left out. Room only shrinks, so rows
    that fit nowhere now never will: only the others are looped over."""
    could = rest[(size[rest] <= room.bytes.max(initial=0)) & (cost[rest] <= room.compute_s)]
    for row in could.tolist():
        up = int(parent[row])
        if (up >= 0 and tier[up] < 0) or cost[row] > room.compute_s:
            continue
        for t in range(int(tier[up]) if up >= 0 else 0, len(TIERS)):
            if size[row] <= room.bytes[t]:
                tier[row] = t
                room.bytes[t] -= size[row]
                room.compute_s -= float(cost[row])
                break


def _execution_order(
    planned: np.ndarray, frame: pd.DataFrame, score: np.ndarray, graph: _Graph
) -> np.ndarray:
    """Planned rows in execution order: priority, a parent just before its most urgent child.

    Priority: smaller needed_in_s, then larger fanout, then higher score, then input order.
    A parent takes the best (lowest) priority rank in its planned subtree; ties between a parent
    and that descendant go to the shallower row, so parents always come first.
    """
    needed = frame["needed_in_s"].to_numpy()[planned]
    fanout = frame["fanout"].to_numpy()[planned]
    by_priority = planned[np.lexsort((planned, -score[planned], -fanout, needed))]
    rank = np.full(len(frame), np.iinfo("int64").max, dtype="int64")
    rank[by_priority] = np.arange(len(by_priority))
    child = graph.children
    child = child[rank[child] < np.iinfo("int64").max]  # planned children (parents are planned)
    for _ in range(int(graph.depth.max(initial=0))):
        np.minimum.at(rank, graph.parent[child], rank[child])
    return planned[np.lexsort((graph.depth[planned], rank[planned]))]


def _plan_frame(
    frame: pd.DataFrame, rows: np.ndarray, tier: np.ndarray, score: np.ndarray
) -> pd.DataFrame:
    """The plan's rows (execution order), with the sequential schedule and each reason."""
    chosen = frame.iloc[rows].reset_index(drop=True)
    cost = chosen["compute_s"].to_numpy()
    finish = np.cumsum(cost)
    start = np.zeros_like(finish)
    start[1:] = finish[:-1]
    plan = pd.DataFrame(
        {
            "order": np.arange(len(rows), dtype="int64"),
            **{c: chosen[c] for c in ("tenant", "key", "item", "kind", "parent")},
            "tier": np.asarray(TIERS, dtype=object)[tier[rows]],
            "score": score[rows],
            **{c: chosen[c] for c in ("predicted_hits", "latency_saved_s", "bytes", "compute_s")},
            "start_s": start,
            "finish_s": finish,
            "source": chosen["source"],
        }
    )
    plan["reason"] = planned_reasons(plan, chosen["needed_in_s"].to_numpy(), chosen["fanout"])
    return plan


def plan_warmup(
    candidates: DataFrame[WarmupCandidate], budgets: Budgets, top_excluded: int = TOP_EXCLUDED
) -> PlanResult:
    """Choose, place and order candidates within `budgets` (the rules: module docstring).

    Args:
        candidates: one row per (tenant, item); parents must be candidates too.
        budgets: bytes per tier, compute seconds and the deadline.
        top_excluded: how many left-out candidates (highest score first) to explain.

    Returns:
        The plan (a `WarmupPlan`), the explained exclusions and a summary.

    Raises:
        pandera.errors.SchemaErrors: a candidate row breaks the contract.
        ValueError: parents form a cycle.
    """
    frame = WarmupCandidate.validate(candidates, lazy=True).reset_index(drop=True)
    graph = _graph(frame)
    score = frame["predicted_hits"].to_numpy() * frame["latency_saved_s"].to_numpy()
    size = frame["bytes"].to_numpy(dtype="int64")
    cost = frame["compute_s"].to_numpy(dtype="float64")
    eligible = graph.down(score > 0, np.logical_and)
    density = graph.down(score / size, np.minimum)
    rank = np.lexsort((np.arange(len(frame)), -score, graph.depth, -density))
    rank = rank[eligible[rank]]
    limit = budgets.compute_limit_s * (1 - _SUM_MARGIN)
    room = _Room(np.array(budgets.tier_bytes, dtype="int64"), limit)
    tier = _fill_tiers(rank, size, cost, graph.parent, room)
    rows = _execution_order(np.flatnonzero(tier >= 0), frame, score, graph)
    plan = WarmupPlan.validate(_plan_frame(frame, rows, tier, score), lazy=True)
    labels = exclusion_labels(frame, score, tier, graph.parent, room.bytes, room.compute_s, budgets)
    summary = summarise(frame, plan, frame["needed_in_s"].to_numpy()[rows], labels, budgets)
    excluded = excluded_table(frame, score, labels, top_excluded)
    return PlanResult(plan=plan, excluded=excluded, summary=summary)

"""Why each item is in or out of a warm-up plan, and the plan's summary.

An operator reading a plan asks "why this?" and "why not that?": every planned row carries a
one-line reason (its value, its tier, its timing), and the best candidates left out carry the
constraint that kept them out, named as the planner met it (a full tier, the compute budget,
the deadline, a parent that was not planned, no predicted hits). `print_plan` shows both to a
person (`preheat warmup --plan-only`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from data_contracts.warmup import TIERS, WARMUP_SOURCES

if TYPE_CHECKING:
    from rich.console import Console

    from models.warmup.plan import Budgets, PlanResult

SOURCE_TEXT = {
    "heat": "decayed request frequency of the recent demand series (heat)",
    "recency_frequency": "request counts over the recent window (recency/frequency)",
}
EXCLUDED_COLUMNS = ("tenant", "key", "item", "kind", "parent", "score", "bytes", "compute_s")


def planned_reasons(plan: pd.DataFrame, needed_in_s: np.ndarray, fanout: pd.Series) -> list[str]:
    """One line per planned row: value = hits x seconds, tier, timing, sharing, parent."""
    columns = [
        plan[c].tolist()
        for c in ("score", "predicted_hits", "latency_saved_s", "tier", "finish_s", "parent")
    ]
    reasons = []
    rows = zip(*columns, needed_in_s.tolist(), fanout.tolist(), strict=True)
    for score, hits, saved, tier, finish, parent, needed, shared in rows:
        if finish <= needed:
            timing = f"needed in {needed:.0f} s, ready at {_seconds(finish)} s"
        else:
            timing = f"ready {_seconds(finish - needed)} s after its first predicted request"
        line = f"score {score:.2f} s saved = {hits:.1f} hits x {saved:.3f} s; fits {tier}; {timing}"
        if shared > 1:
            line += f"; shared by {shared} keys"
        if isinstance(parent, str):
            line += f"; after {parent}"
        reasons.append(line)
    return reasons


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.3f}"


def _full_tiers_text(mask: int) -> str:
    names = [name for bit, name in enumerate(TIERS) if mask & (1 << bit)]
    return f"{'/'.join(names)} budget full" if names else "no cache budget"


def exclusion_labels(
    frame: pd.DataFrame,
    score: np.ndarray,
    tier: np.ndarray,
    parent: np.ndarray,
    room_bytes: np.ndarray,
    room_compute_s: float,
    budgets: Budgets,
) -> np.ndarray:
    """The binding constraint of each left-out row (None for planned rows), from what was left
    when the planner finished: room only shrinks, so a row that did not fit then does not now.
    """
    size = frame["bytes"].to_numpy()
    has_parent = parent >= 0
    parent_tier = np.where(has_parent, tier[np.where(has_parent, parent, 0)], 0)
    parent_out = has_parent & (parent_tier < 0)
    full_mask = np.zeros(len(frame), dtype="int64")  # tiers it may use, all without room
    fits_somewhere = np.zeros(len(frame), dtype=bool)
    for t, budget in enumerate(budgets.tier_bytes):
        usable = (t >= parent_tier) & (budget > 0)
        full_mask |= np.where(usable, 1 << t, 0)
        fits_somewhere |= usable & (size <= room_bytes[t])
    no_compute = frame["compute_s"].to_numpy() > room_compute_s
    bytes_text = np.array([_full_tiers_text(m) for m in range(1 << len(TIERS))], dtype=object)
    labels = np.where(fits_somewhere, "", bytes_text[full_mask]).astype(object)
    both = (~fits_somewhere) & no_compute
    labels[both] = labels[both] + f" and {budgets.compute_reason}"
    labels[fits_somewhere & no_compute] = budgets.compute_reason
    labels[parent_out] = "parent not planned"
    labels[score <= 0] = "no predicted hits"
    labels[tier >= 0] = None
    return labels


def excluded_table(
    frame: pd.DataFrame, score: np.ndarray, labels: np.ndarray, top: int
) -> pd.DataFrame:
    """The `top` left-out rows by score, each with "next best: score X; out because ..."."""
    out = np.flatnonzero(pd.notna(labels))
    out = out[np.lexsort((out, -score[out]))][:top]
    table = frame.iloc[out][list(EXCLUDED_COLUMNS[:5])].reset_index(drop=True)
    table["score"] = score[out]
    table["bytes"] = frame["bytes"].to_numpy()[out]
    table["compute_s"] = frame["compute_s"].to_numpy()[out]
    why = [
        f"{label} ({parent})" if label == "parent not planned" else label
        for label, parent in zip(labels[out].tolist(), table["parent"].tolist(), strict=True)
    ]
    table["reason"] = [
        f"next best: score {s:.2f}; out because {w}"
        for s, w in zip(table["score"].tolist(), why, strict=True)
    ]
    return table


def fallback_note(sources: pd.Series) -> str | None:
    """Which candidates were scored without the forecaster, in words; None when none were."""
    counts = sources.value_counts()
    parts = [
        f"{int(counts[s])} of {len(sources)} candidates scored from {SOURCE_TEXT[s]}"
        for s in WARMUP_SOURCES
        if s in SOURCE_TEXT and counts.get(s, 0) > 0
    ]
    return "; ".join(parts) + ", not the forecaster" if parts else None


def summarise(
    frame: pd.DataFrame,
    plan: pd.DataFrame,
    needed_in_s: np.ndarray,
    labels: np.ndarray,
    budgets: Budgets,
) -> dict[str, Any]:
    """Counts, bytes and seconds per tier, sources, exclusions by reason, and the fallback.

    `needed_in_s` is the planned rows' SLA countdown, in plan order (for the late count).
    """
    per_tier = plan.groupby(plan["tier"].astype(object))["bytes"].agg(["size", "sum"])
    tiers = {
        name: {
            "items": int(per_tier["size"].get(name, 0)),
            "bytes": int(per_tier["sum"].get(name, 0)),
            "budget_bytes": int(budget),
        }
        for name, budget in zip(TIERS, budgets.tier_bytes, strict=True)
    }
    left_out = pd.Series(labels[pd.notna(labels)], dtype=object).value_counts()
    finish = plan["finish_s"].to_numpy()
    return {
        "candidates": len(frame),
        "planned": len(plan),
        "excluded": len(frame) - len(plan),
        "tiers": tiers,
        "compute_s": float(plan["compute_s"].sum()),
        "compute_budget_s": float(budgets.compute_s),
        "deadline_s": float(budgets.deadline_s),
        "makespan_s": float(finish[-1]) if len(finish) else 0.0,
        "total_score_s": float(plan["score"].sum()),
        "late_items": int((finish > needed_in_s).sum()),
        "kinds": {str(k): int(v) for k, v in plan["kind"].value_counts().items()},
        "sources": {str(k): int(v) for k, v in plan["source"].value_counts().items()},
        "candidate_sources": {str(k): int(v) for k, v in frame["source"].value_counts().items()},
        "excluded_by_reason": {str(k): int(v) for k, v in left_out.items()},
        "fallback": fallback_note(frame["source"]),
    }


def print_plan(result: PlanResult, console: Console, rows: int = 30) -> None:
    """A table of the first `rows` rows (the reason column carries score, tier and timing), the
    tiers' totals, the fallback, and why the five best candidates left out were."""
    from rich.table import Table

    from models.warmup.plan import MB  # not at the top: the plan module imports this one

    summary = result.summary
    title = f"warm-up plan: {summary['planned']} of {summary['candidates']} candidates"
    table = Table(title=title, title_justify="left")
    for column in ("order", "tier", "item", "finish_s", "reason"):
        table.add_column(column, overflow="fold", ratio=3 if column == "reason" else None)
    for row in result.plan.head(rows).itertuples(index=False):
        table.add_row(str(row.order), row.tier, row.item, f"{row.finish_s:.2f}", row.reason)
    console.print(table)
    tiers = ", ".join(
        f"{name} {t['items']} items / {t['bytes'] / MB:.1f} MB"
        for name, t in summary["tiers"].items()
    )
    console.print(
        f"{tiers}; compute {summary['compute_s']:.2f} s; "
        f"saves {summary['total_score_s']:.1f} s of latency"
    )
    if summary.get("fallback"):
        console.print(f"fallback: {summary['fallback']}")
    for row in result.excluded.head(5).itertuples(index=False):
        console.print(f"left out {row.item}: {row.reason}")

"""The replay's numbers: TTFT percentiles, hit ratios and utilisation per arm, after restarts
and overall, and the JSON of `preheat replay` (fields named in issues 7 and 22).

The printed object is the asked arm's, as before (`hit_ratio`, `ttft_ms`, `after_restart`,
`warmup`, `restore_reference`), with `p99` and `utilisation` beside `p95`; the other arms of the
comparison sit beside it in the same shape (`restore_reference`, and `warmup_off` for warm-up
on), with `recovered`: the share of the restore reference's cut of the after-restart TTFT that
warm-up gets back, (off - on) / (off - reference).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from data_contracts.warmup import TIERS

if TYPE_CHECKING:
    from models.evaluation.replay.engine import ArmResult, ReplayConfig
    from models.evaluation.replay.latency import ReplayLatency


PERCENTILES = (50, 95, 99)


def after_restart_mask(times: np.ndarray, restarts: list[float], window_s: float) -> np.ndarray:
    """(R,) requests that arrive within `window_s` after a restart."""
    mask = np.zeros(len(times), dtype=bool)
    for at in restarts:
        mask |= (times >= at) & (times < at + window_s)
    return mask


def restart_windows_ms(restarts: list[float], window_s: float) -> list[tuple[float, float]]:
    """The scored windows after restarts in ms, overlapping ones merged (a window longer than
    the restart interval must not count its busy time twice)."""
    merged: list[tuple[float, float]] = []
    for at in sorted(restarts):
        low, high = at * 1000, (at + window_s) * 1000
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _ttft(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {**{f"p{q}": 0.0 for q in PERCENTILES}, "mean": 0.0}
    stats = {f"p{q}": round(float(np.percentile(values, q)), 2) for q in PERCENTILES}
    return {**stats, "mean": round(float(values.mean()), 2)}


def window_stats(
    result: ArmResult, mask: np.ndarray, windows_ms: list[tuple[float, float]] | None
) -> dict[str, Any]:
    """Requests, block hit ratio, TTFT and server utilisation of the requests in `mask` (R,),
    the utilisation over `windows_ms` (None: the whole run)."""
    blocks = result.request_blocks[mask].sum()
    utilisation = 0.0
    if result.queue is not None and (windows_ms is None or windows_ms):
        utilisation = result.queue.utilisation(windows_ms)
    return {
        "requests": int(mask.sum()),
        "hit_ratio": round(float(result.hit_blocks[mask].sum() / blocks), 4) if blocks else 0.0,
        "ttft_ms": _ttft(result.ttft_ms[mask]),
        "utilisation": round(utilisation, 4),
    }


def arm_block(result: ArmResult, after: np.ndarray, windows: list[tuple[float, float]]) -> dict:
    """One arm beside the printed one: overall and after-restart figures."""
    overall = window_stats(result, np.ones(len(result.ttft_ms), dtype=bool), None)
    return {
        "hit_ratio": overall["hit_ratio"],
        "ttft_ms": overall["ttft_ms"],
        "utilisation": overall["utilisation"],
        "after_restart": window_stats(result, after, windows),
    }


def recovered(off: float, on: float, reference: float) -> float | None:
    """Share of the reference's cut (off - reference) that warm-up recovers (off - on); None
    when the reference cuts nothing."""
    cut = off - reference
    return round((off - on) / cut, 4) if cut > 0 else None


def warmup_figures(result: ArmResult, config: ReplayConfig) -> dict[str, Any]:
    """An arm's warm-up: items delivered, their precision and cost, the plans' target and their
    own forecast of the precision."""
    items = int(result.warm.get("items", 0))
    return {
        "items": items,
        "precision": round(result.warm.get("used", 0) / items, 4) if items else 0.0,
        "cost_s": result.warm.get("cost_s", 0.0),
        "target_precision": config.target_precision,
        # the plans' own forecast of the precision: their items' mean P(used) when planned
        "expected_precision": (
            round(result.warm.get("expected_used", 0.0) / items, 4) if items else 0.0
        ),
    }


def summarize(
    arms: dict[str, ArmResult], asked: str, request_times: np.ndarray, config: ReplayConfig,
    latency: ReplayLatency,
) -> dict[str, Any]:  # fmt: skip
    """The JSON of `preheat replay` for arm `asked` ("off" or "on") of `arms` (which hold
    "off", "reference" and, for warm-up on, "on"); see the module docstring."""
    result = arms[asked]
    after = after_restart_mask(request_times, result.restarts, config.window_s)
    windows = restart_windows_ms(result.restarts, config.window_s)
    block = arm_block(result, after, windows)
    summary: dict[str, Any] = {
        "requests": len(result.ttft_ms),
        "hit_ratio": {
            **{tier: round(result.served[tier] / result.blocks, 4) for tier in TIERS},
            "total": round(sum(result.served.values()) / result.blocks, 4),
        },
        "ttft_ms": block["ttft_ms"],
        "utilisation": block["utilisation"],
        "after_restart": block["after_restart"],
        "warmup": warmup_figures(result, config),
        "restore_reference": arm_block(arms["reference"], after, windows),
    }
    if asked == "on" and "off" in arms:
        off = summary["warmup_off"] = arm_block(arms["off"], after, windows)
        reference = summary["restore_reference"]
        summary["recovered"] = {
            f"{q}_after_restart": recovered(
                off["after_restart"]["ttft_ms"][q], block["after_restart"]["ttft_ms"][q],
                reference["after_restart"]["ttft_ms"][q],
            )
            for q in ("p50", "p95", "p99", "mean")
        }  # fmt: skip
    summary.update(
        restarts=len(result.restarts),
        # Failed tier operations (each degraded to a miss): non-zero means the machine, not the
        # policy, shaped some of the numbers.
        tier_errors=int(result.warm.get("tier_errors", 0)),
        tiers="real" if config.real_tiers else "simulated",
        load=config.load,
        config=asdict(config),
        latency_model=latency.to_dict(),
    )
    return summary

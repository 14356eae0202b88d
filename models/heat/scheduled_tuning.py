"""The scheduled decay tuning's two ends: the window it tunes on, and publishing what it found.

The window is the last N requests of a Mooncake-format trace or, without one, of the lake (KV
pages and priorities, what the deployment tunes on); the result is published to
`<data_dir>/tuning/decay.json`, where the cache runtime reads its half-life and priority weight.
No Prefect here: the `tune-decay` flow (`flows.tuning.flow`) runs these as its steps and logs
the run to MLflow in between.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cache_runtime.heat import DecayParams, decay_params_path
from cache_runtime.traces import AccessTrace, load_trace, trace_from_requests
from models.heat.tuning import tune_decay


def lake_trace(data_dir: str | Path) -> AccessTrace:
    """The lake's requests as a trace of KV pages, with their priorities (what the scheduled
    tuning runs on)."""
    from data_contracts.lake import Lake

    columns = ["timestamp", "prefix_hashes", "prompt_tokens", "priority"]
    return trace_from_requests(Lake(Path(data_dir) / "lake").read("requests", columns), "lake")


def tune_window(
    trace: str | None, data_dir: str, window: int, capacity: float, rounds: int, grid: int
) -> dict[str, Any]:
    """`tune_decay` on the last `window` requests of `trace` (else of the lake), with a cache of
    `capacity` x the window's unique pages.

    Raises:
        TraceError: the trace, or the lake, has no requests with KV pages to tune on.
    """
    full = load_trace(Path(trace), "mooncake") if trace else lake_trace(data_dir)
    loaded = full.last_requests(window)
    entries = max(1, round(capacity * loaded.unique))
    return tune_decay(
        loaded.accesses, loaded.request_starts, loaded.times, entries, rounds, grid,
        priorities=loaded.priorities,
    )  # fmt: skip


def publish_decay(result: dict[str, Any], data_dir: str, run_id: str) -> None:
    """Write the best half-life (and weight) where the cache runtime reads them. When the
    window's requests all had one priority the weight was not searched: the published one is
    kept."""
    best = result["best"]
    path = decay_params_path(data_dir)
    weight = best["priority_weight"]
    if weight is None:  # not searched on this window: keep what was published
        weight = DecayParams.load(path).priority_weight
    DecayParams(half_life_s=best["half_life_s"], priority_weight=weight).save(
        path, objective=best["objective"], mlflow_run_id=run_id
    )

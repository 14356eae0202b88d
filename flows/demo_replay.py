"""The demo's A/B replay: the latest traffic of the lake, warm-up off and on, with restarts.

The lake's requests carry chained 16-token page hashes, so they replay exactly like a Mooncake
trace. The window is the most recent `REQUESTS` requests (a minute of demo time per arm), the
node restarts three times in it, and the report lands in `<data_dir>/reports/replay/`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from cache_runtime.prefix_hash import BLOCK_TOKENS
from cache_runtime.settings import Settings
from data_contracts.lake import Lake
from flows.bench.traces import trace_from_requests
from flows.replay.engine import (
    PreparedTrace,
    ReplayConfig,
    reference_config,
    replay_arms,
    request_times,
    summarize,
)
from flows.replay.latency import measure_latency
from flows.replay.report import write_report

REQUESTS = 800


def run_replay_stage(lake: Lake, settings: Settings, console: Console) -> dict[str, Any]:
    """Replay the latest requests with warm-up off and on; print a table; write the report."""
    requests = lake.read("requests", columns=["timestamp", "prefix_hashes", "prompt_tokens"])
    trace = trace_from_requests(requests, "demo lake").last_requests(REQUESTS)
    assert trace.times is not None
    span = float(trace.times[-1] - trace.times[0])
    off = ReplayConfig(
        memory=0.05, ssd=0.2, restart_every_s=span / 4, window_s=span / 8, warmup=False
    )
    on = replace(off, warmup=True)
    latency = measure_latency(block_tokens=BLOCK_TOKENS)
    arms = replay_arms(
        PreparedTrace.build(trace), {"off": off, "on": on, "reference": reference_config(off)},
        latency,
    )  # fmt: skip
    times = request_times(trace)
    summaries = {
        name: summarize(arms[name], arms["reference"], times, config, latency)
        for name, config in (("off", off), ("on", on))
    }
    labelled = {
        "warm-up off": arms["off"], "warm-up on": arms["on"], "restore reference": arms["reference"]
    }  # fmt: skip
    report = write_report(
        settings.data_dir / "reports" / "replay", labelled, times, summaries, off.window_s
    )
    _print_table(summaries, console)
    console.print(f"replay report -> {report}")
    return {
        name: {
            "after_restart": s["after_restart"],
            "warmup": s["warmup"],
            "hit_ratio": s["hit_ratio"]["total"],
        }
        for name, s in summaries.items()
    } | {"restore_reference": summaries["on"]["restore_reference"], "report": str(report)}


def _print_table(summaries: dict[str, dict[str, Any]], console: Console) -> None:
    table = Table(title="A/B replay of the latest traffic, 3 restarts", title_justify="left")
    for column in ("arm", "hit", "hit after restarts", "TTFT ms after", "warmed", "precision"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    reference = summaries["on"]["restore_reference"]["after_restart"]
    rows = [(name, s["hit_ratio"]["total"], s["after_restart"], s["warmup"])
            for name, s in summaries.items()]  # fmt: skip
    for name, hit, after, warm in rows:
        table.add_row(
            f"warm-up {name}", f"{hit:.3f}", f"{after['hit_ratio']:.3f}",
            f"{after['ttft_ms']['mean']:.1f}", str(warm["items"]), f"{warm['precision']:.2f}",
        )  # fmt: skip
    table.add_row(
        "restore ref.", "", f"{reference['hit_ratio']:.3f}",
        f"{reference['ttft_ms']['mean']:.1f}", "", "",
    )  # fmt: skip
    console.print(table)

"""The demo's A/B replay: the latest traffic of the lake, warm-up off and on, with restarts.

The lake's requests carry chained 16-token page hashes, so they replay exactly like a Mooncake
trace. The window is the most recent `REQUESTS` requests, the node restarts three times in it, and
the report lands in `<data_dir>/reports/replay/`. TTFT comes from the queue-aware reference model
(`models.evaluation.replay.latency.REFERENCE`: a 7-8B model, FIFO chunked prefill) on one GPU, the
demo's one node, with its loads scaled to 16-token pages; every arm is priced by it. Measuring the
tiny demo model instead (as before) priced a block at a fraction of a millisecond, which made
warm-up look pointless. At the demo's own rate the GPU is nearly idle, so the table shows what the
cache saves, not a queue: `preheat replay --load` shows the queue on Mooncake.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from cache_runtime.prefix_hash import PAGE_TOKENS
from cache_runtime.settings import Settings
from cache_runtime.traces import trace_from_requests
from data_contracts.lake import Lake
from models.evaluation.replay.engine import ReplayConfig, replay_comparison, summarize
from models.evaluation.replay.latency import REFERENCE
from models.evaluation.replay.report import COLUMNS, arm_rows, row_cells, write_report

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
    latency = replace(REFERENCE.for_block_tokens(PAGE_TOKENS), servers=1)
    arms, times = replay_comparison(trace, off, latency, both=True)
    summaries = {
        name: summarize(arms, name, times, replace(off, warmup=name == "on"), latency)
        for name in ("off", "on")
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


# Below this share of busy prefill servers no queue forms, and what the cache saves is each
# request's own prefill only: the table says so, instead of leaving "warm-up saves nothing".
IDLE_UTILISATION = 0.2


def _print_table(summaries: dict[str, dict[str, Any]], console: Console) -> None:
    console.print(replay_table(summaries))
    busy = summaries["off"]["utilisation"]
    if busy < IDLE_UTILISATION:
        console.print(
            f"The node is {busy:.1%} busy at the demo's rate, so no queue forms and TTFT is each "
            "request's own prefill. Where a cold node's misses fill the queue: `preheat replay "
            "--trace $TRACES/mooncake_synthetic_trace.jsonl --format mooncake --memory 0.05 "
            "--ssd 0.2 --restart-every 300 --warmup on --latency reference --load 2` "
            "(docs/replay.md)."
        )


def replay_table(summaries: dict[str, dict[str, Any]]) -> Table:
    """The report's table turned on its side: one column per arm, one row per figure.

    Eight figures side by side need some 150 columns; a terminal of 80 (and `make demo`'s output
    in a pipe, which rich renders at 80) cut the arm names and headers to "refere…", "p50/p9…".
    Three arms side by side fit, wrapping at spaces where they must.
    """
    title = (
        "A/B replay of the latest traffic, 3 restarts; TTFT from the queue-aware reference "
        "model (a 7-8B model on one GPU, FIFO chunked prefill)"
    )
    rows = arm_rows(summaries)
    table = Table(title=title, title_justify="left")
    table.add_column("", justify="left", ratio=3)
    for row in rows:
        table.add_column(row["label"], justify="right", ratio=2)
    cells = [row_cells(row) for row in rows]  # per arm, in `COLUMNS` order
    for i, figure in enumerate(COLUMNS[1:], start=1):
        table.add_row(figure, *(arm[i] for arm in cells))
    return table

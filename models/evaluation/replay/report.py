"""The replay's HTML report: a table of the arms first (hit ratio, p50/p95/p99 TTFT and server
utilisation after restarts and overall, warm-up items and precision), then hit ratio over clock
time with restarts marked and TTFT with and without warm-up; logged to MLflow when a store is
given. The JSON of each arm is written beside it (`replay.json`), not into the page.

Plots are matplotlib `Figure`s (no pyplot: no global backend, nothing left open) embedded in one
self-contained HTML file as PNGs, so the report can be mailed or attached to a ticket.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from models.evaluation.replay.engine import ArmResult, ReplayConfig, after_restart_mask
from models.evaluation.replay.latency import ReplayLatency
from models.evaluation.replay.summary import summarize

BIN_S = 30.0
EXPERIMENT = "preheat-replay"
EPOCH_AFTER_S = 1e9  # trace times past this are epoch seconds (2001 on), else from the start
CLOCK_STEPS_S = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
COLUMNS = (
    "arm", "hit ratio", "hit after restarts", "TTFT p50/p95/p99 ms after restarts",
    "TTFT p50/p95/p99 ms overall", "utilisation after / overall", "warm-up items", "precision",
)  # fmt: skip


def arm_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm — warm-up off, warm-up on (when `summaries` has it), the restore
    reference — from the JSON of `preheat replay` for "off" and/or "on": label, overall and
    after-restart figures, and the warm-up's (None for the arms that warm nothing)."""
    rows = []
    for arm in ("off", "on"):
        if arm in summaries:
            summary = summaries[arm]
            rows.append(
                {"label": f"warm-up {arm}", **_figures(summary), "warmup": summary["warmup"]}
            )
    reference = next(iter(summaries.values()))["restore_reference"]
    rows.append({"label": "restore reference", **_figures(reference), "warmup": None})
    return rows


def _figures(block: dict[str, Any]) -> dict[str, Any]:
    hit = block["hit_ratio"]
    return {
        "hit_ratio": hit["total"] if isinstance(hit, dict) else hit,
        "ttft_ms": block["ttft_ms"],
        "utilisation": block["utilisation"],
        "after_restart": block["after_restart"],
    }


def _percentiles(ttft: dict[str, float]) -> str:
    return " / ".join(
        f"{ttft[q]:,.0f}" if ttft[q] >= 100 else f"{ttft[q]:.1f}" for q in ("p50", "p95", "p99")
    )


def _share(value: float) -> str:
    return f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def row_cells(row: dict[str, Any]) -> list[str]:
    """The `COLUMNS` of one `arm_rows` row as text (the report's table and the demo's)."""
    after, warm = row["after_restart"], row["warmup"]
    return [
        row["label"], f"{row['hit_ratio']:.3f}", f"{after['hit_ratio']:.3f}",
        _percentiles(after["ttft_ms"]), _percentiles(row["ttft_ms"]),
        f"{_share(after['utilisation'])} / {_share(row['utilisation'])}",
        "" if warm is None else str(warm["items"]),
        "" if warm is None else f"{warm['precision']:.2f}",
    ]  # fmt: skip


def _table_html(summaries: dict[str, dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row_cells(row)) + "</tr>"
        for row in arm_rows(summaries)
    )
    any_summary = next(iter(summaries.values()))
    model = any_summary["latency_model"]
    caption = (
        f"{any_summary['requests']} requests, {any_summary['restarts']} restarts, load "
        f"{any_summary['load']:g}x, {any_summary['tiers']} tiers; TTFT from the queue-aware "
        f"model: {model['servers']} prefill servers, {model['source']}"
    )
    return (
        f"<table border='1' cellpadding='4' style='border-collapse:collapse'>"
        f"<caption>{html.escape(caption)}</caption><tr>{head}</tr>{body}</table>"
    )


def _clock_axis(axes: Any, times: np.ndarray) -> None:
    """Label the x axis (trace seconds) as clock time: UTC time of day for epoch times, else
    hours:minutes:seconds since the trace's start."""
    from datetime import UTC, datetime

    from matplotlib.ticker import FuncFormatter, MultipleLocator

    span = float(times.max() - times.min())
    step = next((s for s in CLOCK_STEPS_S if s >= span / 8), CLOCK_STEPS_S[-1])
    axes.xaxis.set_major_locator(MultipleLocator(step))  # round minutes and hours
    if float(times.min()) > EPOCH_AFTER_S:
        day = datetime.fromtimestamp(float(times.min()), UTC).strftime("%Y-%m-%d")
        axes.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: datetime.fromtimestamp(x, UTC).strftime("%H:%M")
        ))  # fmt: skip
        axes.set_xlabel(f"time (UTC, from {day}); dashed: restarts")
        return
    start = float(times.min())

    def elapsed(x: float, _: Any) -> str:
        seconds = max(0, round(x - start))
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

    axes.xaxis.set_major_formatter(FuncFormatter(elapsed))
    axes.set_xlabel("time since the trace's start (h:mm:ss); dashed: restarts")


def _hit_ratio_figure(arms: dict[str, ArmResult], times: np.ndarray, restarts: list[float]) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.5))
    axes = figure.subplots()
    edges = np.arange(times.min(), times.max() + BIN_S, BIN_S)
    bins = np.digitize(times, edges)  # (R,) bin of each request
    for name, arm in arms.items():
        hits = np.bincount(bins, weights=arm.hit_blocks, minlength=len(edges) + 1)
        blocks = np.bincount(bins, weights=arm.request_blocks, minlength=len(edges) + 1)
        ratio = np.divide(hits, blocks, out=np.full_like(hits, np.nan), where=blocks > 0)
        axes.plot(edges, ratio[1 : len(edges) + 1], label=name)
    for at in restarts:
        axes.axvline(at, color="grey", linestyle="--", linewidth=0.8)
    _clock_axis(axes, times)
    axes.set_ylabel(f"block hit ratio per {BIN_S:g} s")
    axes.legend()
    figure.tight_layout()
    return figure


def _ttft_figure(arms: dict[str, ArmResult], after: np.ndarray) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.5))
    axes = figure.subplots()
    for name, arm in arms.items():
        values = np.sort(arm.ttft_ms[after] if after.any() else arm.ttft_ms)
        axes.plot(values, np.arange(1, len(values) + 1) / len(values), label=name)
    axes.set_xscale("log")
    axes.set_xlabel("modelled TTFT (ms, queue included), requests after restarts")
    axes.set_ylabel("share of requests")
    axes.legend()
    figure.tight_layout()
    return figure


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def write_report(
    directory: Path,
    arms: dict[str, ArmResult],
    times: np.ndarray,
    summaries: dict[str, dict[str, Any]],
    window_s: float,
) -> Path:
    """`replay.html` plus the two PNGs and `replay.json` in `directory`; returns the HTML path.

    `arms`: the replays to draw, by label (warm-up off, on, restore reference); `times`: (R,)
    arrival of each request; `summaries`: the JSON of each warm-up arm.
    """
    directory.mkdir(parents=True, exist_ok=True)
    restarts = next((arm.restarts for arm in arms.values() if arm.restarts), [])
    after = after_restart_mask(times, restarts, window_s)
    pngs = {
        "hit_ratio_over_time.png": _png(_hit_ratio_figure(arms, times, restarts)),
        "ttft_after_restart.png": _png(_ttft_figure(arms, after)),
    }
    for name, data in pngs.items():
        (directory / name).write_bytes(data)
    (directory / "replay.json").write_bytes(orjson.dumps(summaries, option=orjson.OPT_INDENT_2))
    images = "".join(
        f'<h2>{html.escape(name)}</h2><img src="data:image/png;base64,'
        f'{base64.b64encode(data).decode()}">'
        for name, data in pngs.items()
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Preheat replay</title></head>"
        f"<body><h1>Warm-up A/B replay</h1>{_table_html(summaries)}{images}"
        "<p>Every figure of each arm: <code>replay.json</code> beside this page.</p>"
        "</body></html>"
    )
    path = directory / "replay.html"
    path.write_text(page)
    return path


def report_comparison(
    directory: Path, results: dict[str, ArmResult], times: np.ndarray, config: ReplayConfig,
    latency: ReplayLatency, asked: dict[str, Any],
) -> tuple[Path, dict[str, dict[str, Any]]]:  # fmt: skip
    """The report of one comparison (`replay_comparison(..., both=True)`): both warm-up arms
    summarised (`asked`: the asked arm's summary, kept as it is) and drawn beside the restore
    reference; returns the HTML path and the two summaries."""
    asked_arm = "on" if config.warmup else "off"
    summaries = {
        arm: asked if arm == asked_arm else summarize(
            results, arm, times, replace(config, warmup=arm == "on"), latency
        )
        for arm in ("off", "on")
    }  # fmt: skip
    by_label = {
        "warm-up off": results["off"], "warm-up on": results["on"],
        "restore reference": results["reference"],
    }  # fmt: skip
    return write_report(directory, by_label, times, summaries, config.window_s), summaries


def log_report(
    report_dir: Path, summaries: dict[str, dict[str, Any]], tracking_uri: str, artifacts: Path
) -> str:
    """One MLflow run in `preheat-replay` with the report and its key numbers; the run id."""
    import mlflow

    from models.tracking import experiment_id as get_experiment

    experiment_id = get_experiment(EXPERIMENT, tracking_uri, artifacts)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        config = next(iter(summaries.values()))["config"]
        mlflow.log_params({k: v for k, v in config.items() if k != "warmup"})
        for arm, summary in summaries.items():
            after = summary["after_restart"]
            for q in ("p50", "p95", "p99", "mean"):
                mlflow.log_metric(f"{arm}.after_restart.ttft_{q}_ms", after["ttft_ms"][q])
            mlflow.log_metric(f"{arm}.after_restart.utilisation", after["utilisation"])
            mlflow.log_metric(f"{arm}.utilisation", summary["utilisation"])
            mlflow.log_metric(f"{arm}.hit_ratio", summary["hit_ratio"]["total"])
            mlflow.log_metric(f"{arm}.warmup.precision", summary["warmup"]["precision"])
        mlflow.log_artifacts(str(report_dir), artifact_path="report")
        return run.info.run_id

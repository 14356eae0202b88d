"""The replay's HTML report: hit ratio over time with restarts marked, TTFT with and without
warm-up, and the numbers; logged to MLflow when a store is given.

Plots are matplotlib `Figure`s (no pyplot: no global backend, nothing left open) embedded in one
self-contained HTML file as PNGs, so the report can be mailed or attached to a ticket.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from flows.replay.engine import ArmResult, after_restart_mask

BIN_S = 30.0
EXPERIMENT = "preheat-replay"


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
    axes.set_xlabel("trace time (s); dashed: restarts")
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
    axes.set_xlabel("modelled TTFT (ms), requests after restarts")
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
    body = html.escape(orjson.dumps(summaries, option=orjson.OPT_INDENT_2).decode())
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Preheat replay</title></head>"
        f"<body><h1>Warm-up A/B replay</h1>{images}<h2>Numbers</h2><pre>{body}</pre></body></html>"
    )
    path = directory / "replay.html"
    path.write_text(page)
    return path


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
            mlflow.log_metric(f"{arm}.after_restart.ttft_mean_ms",
                              summary["after_restart"]["ttft_ms"]["mean"])  # fmt: skip
            mlflow.log_metric(f"{arm}.hit_ratio", summary["hit_ratio"]["total"])
            mlflow.log_metric(f"{arm}.warmup.precision", summary["warmup"]["precision"])
        mlflow.log_artifacts(str(report_dir), artifact_path="report")
        return run.info.run_id

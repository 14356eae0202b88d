"""`preheat demo`: the whole pipeline on embedded defaults, end to end, with a summary.

The stages, in order: generate a realistic multi-tenant log, ingest it through the Prefect
`ingest` flow, stream live traffic through Redis Streams and the `ingest-stream` flow, build
demand features (`features` flow), train and register the forecaster and the heat simulator in
MLflow, register the tiny demo LLM, replay the latest traffic with warm-up off and on across node
restarts, cache KV pages of the top templates' prompts in the hybrid cache, and summarise.

Wiring without a Prefect import of its own: it calls the flows (which bring Prefect) and the
stages in `models`, and prints what each did.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from cache_runtime.services import RedisHandle
from cache_runtime.settings import Settings
from data_contracts.lake import Lake
from models.evaluation.demo_stages import (
    ensure_llm_champion,
    predicted_hottest,
    send_live_traffic,
    simulate_burst,
    summary_tables,
)
from models.ingest.synthetic import SyntheticLogSpec, write_synthetic_log
from models.training import quiet_training


def _stream_live_traffic(
    settings: Settings, spec: SyntheticLogSpec, console: Console, url: str
) -> dict:
    """Send one hour of fresh traffic through the producer -> stream -> consumer-group path."""
    from flows.ingest.flow import ingest_stream_flow

    sent = send_live_traffic(settings, spec, url)
    console.print(f"live: {sent} requests sent to stream {settings.request_stream}")
    return ingest_stream_flow(
        redis_url=url, data_dir=str(settings.data_dir), stream=settings.request_stream
    )


def _forecast_stage(settings: Settings) -> dict:
    """Train and gate the per-key forecaster, then ask the champion for the next buckets."""
    from flows.forecast.flow import train_forecaster_flow

    quiet_training()  # the summary, not Lightning's banners
    settings.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    result = train_forecaster_flow(
        data_dir=str(settings.data_dir), mlflow_uri=settings.mlflow_uri,
        mlflow_artifacts=str(settings.mlflow_artifacts), top_k=20, horizon=6, epochs=3,
    )  # fmt: skip
    hottest = predicted_hottest(settings)
    return {
        key: result[key] for key in ("version", "promoted", "reason", "chosen", "tail_coverage")
    } | {
        "eval_mae": result["eval_mae"],
        "hotset_recall": {name: round(v, 4) for name, v in result["hotset_recall"].items()},
        "predicted_hottest": hottest,
    }


def _heat_stage(settings: Settings) -> dict:
    """Train and gate the heat GAN, then ask the champion what a burst on the first tenant's
    tenth-ranked key would do to its warm-up plan (figure in data/reports/heat_sim.png)."""
    from flows.heat.flow import train_heat_gan_flow

    result = train_heat_gan_flow(
        data_dir=str(settings.data_dir), mlflow_uri=settings.mlflow_uri,
        mlflow_artifacts=str(settings.mlflow_artifacts), top_k=20, epochs=3,
    )  # fmt: skip
    out = {key: result[key] for key in ("version", "promoted", "reason")}
    simulated = simulate_burst(settings)
    return out if simulated is None else out | {"simulated": simulated}


def _ingest_stage(settings: Settings, log: Path | None, spec: SyntheticLogSpec,
                  console: Console) -> dict:  # fmt: skip
    """The log (generated unless given) through the `ingest` flow; returns its totals."""
    from flows.ingest.flow import ingest_flow

    if log is None:
        log = settings.data_dir / "demo" / "requests.jsonl"
        with console.status("generating a synthetic multi-tenant request log"):
            count = write_synthetic_log(log, spec)
        console.print(f"generated {count} requests over {spec.days:g} days -> {log}")
    with console.status("flow ingest: validating the log into the lake"):
        ingested = ingest_flow(paths=[str(log)], data_dir=str(settings.data_dir))
    console.print(
        f"ingest: read {ingested['read']}, accepted {ingested['accepted']}, "
        f"quarantined {ingested['quarantined']}"
    )
    return {k: ingested[k] for k in ("read", "accepted", "quarantined")}


def _model_stages(settings: Settings, console: Console) -> dict[str, Any]:
    """Features, the forecaster, the heat simulator and the LLM, each printed as it ends."""
    from flows.features.flow import features_flow

    with console.status("flow features: demand series at 5 s, 3 min, 1 h"):
        feature_rows = features_flow(data_dir=str(settings.data_dir))
    console.print(f"features: {feature_rows}")
    with console.status("flow train-forecaster: attention vs baselines, MLflow champion"):
        forecast = _forecast_stage(settings)
    console.print(
        f"train-forecaster: v{forecast['version']} chose {forecast['chosen']}, {forecast['reason']}"
    )
    with console.status("flow train-heat-gan: the heat simulator, realism vs naive"):
        heat = _heat_stage(settings)
    console.print(f"train-heat-gan: v{heat['version']}, {heat['reason']}")
    if "simulated" in heat:
        sim = heat["simulated"]
        console.print(
            f"simulate heat: a burst on {sim['tenant']}'s {sim['key']} moves it from rank "
            f"{sim['rank_before']} to {sim['rank_after']}; top 5 gains {sim['entered_top_5']}"
        )
    with console.status("registry: the tiny GPT-2 as preheat-llm, for warm-up and serving"):
        llm = {"champion": ensure_llm_champion(settings)}
    console.print(f"registry: preheat-llm@champion is version {llm['champion']}")
    return {"forecast": forecast, "heat": heat, "llm": llm}


def run_demo(settings: Settings, log: Path | None, days: float, console: Console) -> dict:
    """Run every stage; returns (and writes to <data_dir>/reports/demo_summary.json) a summary."""
    from models.evaluation.demo_cache import run_cache_stage
    from models.evaluation.demo_replay import run_replay_stage

    started = time.perf_counter()
    spec = SyntheticLogSpec(days=days)
    ingested = _ingest_stage(settings, log, spec, console)
    lake = Lake(settings.data_dir / "lake")
    with RedisHandle(settings.redis_url) as redis_url:
        with console.status("flow ingest-stream: live traffic through Redis Streams"):
            streamed = _stream_live_traffic(settings, spec, console, redis_url)
        console.print(f"ingest-stream: {streamed['written']} new rows, {streamed['acked']} acked")
        stages = _model_stages(settings, console)
        with console.status("replay: the latest traffic, warm-up off and on, 3 restarts"):
            replay = run_replay_stage(lake, settings, console)
        with console.status("cache: KV pages of the top templates, tiny GPT-2, three tiers"):
            prompts = lake.read("requests", columns=["tenant", "template_id", "prompt"])
            cache = run_cache_stage(prompts, settings.data_dir / "cache", redis_url, console)
    summary = summary_tables(lake, settings, console)
    summary.update(
        ingested=ingested,
        streamed=streamed,
        cache=cache,
        forecast=stages["forecast"],
        heat=stages["heat"],
        llm=stages["llm"],
        replay=replay,
        wall_seconds=round(time.perf_counter() - started, 1),
    )
    report = settings.data_dir / "reports" / "demo_summary.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    console.print(f"demo finished in {summary['wall_seconds']} s; summary -> {report}")
    return summary

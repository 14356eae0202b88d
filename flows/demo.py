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
from dataclasses import replace
from pathlib import Path

import orjson
import pandas as pd
import redis
from rich.console import Console
from rich.table import Table

from cache_runtime.request_stream import RequestLogProducer
from cache_runtime.services import RedisHandle
from cache_runtime.settings import Settings
from data_contracts.derived import read_demand
from data_contracts.lake import Lake
from models.ingest.synthetic import SyntheticLogSpec, generate_requests, write_synthetic_log


def _stream_live_traffic(
    settings: Settings, spec: SyntheticLogSpec, console: Console, url: str
) -> dict:
    """Send one hour of fresh traffic through the producer -> stream -> consumer-group path."""
    from flows.ingest.flow import ingest_stream_flow

    live_spec = replace(
        spec,
        days=1 / 24,
        seed=spec.seed + 1,
        bursts=0,
        start=spec.start + pd.Timedelta(days=spec.days),
    )
    live = generate_requests(live_spec)
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)
    producer = RequestLogProducer(
        client, settings.request_stream, settings.request_stream_maxlen,
        spool_dir=settings.data_dir / "spool",
    )  # fmt: skip
    for record in live:
        producer.log_request(
            **{k: v for k, v in record.items() if k not in ("timestamp", "request_id")},
            request_id=f"live-{record['request_id']}",
            timestamp=pd.Timestamp(record["timestamp"]).timestamp(),
        )
    producer.close()
    client.close()
    console.print(f"live: {producer.stats.sent} requests sent to stream {settings.request_stream}")
    return ingest_stream_flow(
        redis_url=url, data_dir=str(settings.data_dir), stream=settings.request_stream
    )


def _summary_tables(lake: Lake, settings: Settings, console: Console) -> dict:
    requests = lake.read("requests", columns=["timestamp", "tenant", "template_id"])
    by_tenant = requests.groupby("tenant", observed=True).size().sort_values(ascending=False)
    table = Table(title="requests in the lake by tenant", title_justify="left")
    table.add_column("tenant")
    table.add_column("requests", justify="right")
    table.add_column("templates", justify="right")
    for tenant, count in by_tenant.items():
        templates = requests.loc[requests["tenant"] == tenant, "template_id"].nunique()
        table.add_row(str(tenant), str(count), str(templates))
    console.print(table)
    features_dir = settings.data_dir / "features"
    five_s = read_demand(features_dir, "5s")
    keyed = five_s[five_s["key"] != "__total__"]
    burst = keyed.loc[keyed["count"].idxmax()] if len(keyed) else None
    hourly = read_demand(features_dir, "1h")
    totals = hourly[hourly["key"] == "__total__"].groupby("bucket_start")["count"].sum()
    top = keyed.groupby(["tenant", "key"], observed=True)["count"].sum().nlargest(5).reset_index()
    table = Table(title="top keys by demand", title_justify="left")
    for column in ("tenant", "key", "requests"):
        table.add_column(column, justify="right" if column == "requests" else "left")
    for row in top.itertuples(index=False):
        table.add_row(str(row.tenant), str(row.key), f"{row.count:.0f}")
    console.print(table)
    return {
        "requests": len(requests),
        "tenants": {str(k): int(v) for k, v in by_tenant.items()},
        "quarantined": lake.count("quarantine"),
        "feature_rows": {g: len(read_demand(features_dir, g)) for g in ("5s", "3min", "1h")},
        "peak_hour_to_trough_ratio": round(float(totals.max() / max(totals.min(), 1)), 2),
        "largest_5s_burst": None
        if burst is None
        else {
            "tenant": str(burst["tenant"]),
            "key": str(burst["key"]),
            "count": int(burst["count"]),
            "at": burst["bucket_start"].isoformat(),
        },
    }


def _forecast_stage(settings: Settings) -> dict:
    """Train and gate the per-key forecaster, then ask the champion for the next buckets."""
    from data_contracts.derived import read_demand
    from flows.cli.forecast import quiet_training
    from flows.forecast.flow import train_forecaster_flow
    from models.forecast.registry import load_champion

    quiet_training()  # the summary, not Lightning's banners
    settings.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    result = train_forecaster_flow(
        data_dir=str(settings.data_dir), mlflow_uri=settings.mlflow_uri,
        mlflow_artifacts=str(settings.mlflow_artifacts), top_k=20, horizon=6, epochs=3,
    )  # fmt: skip
    demand = read_demand(settings.data_dir / "features", "3min")
    hottest = []
    try:
        forecast = load_champion(settings.mlflow_uri).predict_per_key(demand)
    except LookupError:  # gating rejected the first model: nothing is deployed yet
        forecast = None
    if forecast is not None:
        named = forecast[~forecast["key"].str.startswith("__")]
        top = named.groupby(["tenant", "key"], observed=True)["predicted"].sum().nlargest(3)
        hottest = [
            {"tenant": str(t), "key": str(k), "next_30_min": round(float(v), 1)}
            for (t, k), v in top.items()
        ]
    return {
        key: result[key] for key in ("version", "promoted", "reason", "chosen", "tail_coverage")
    } | {"eval_mae": result["eval_mae"], "predicted_hottest": hottest}


def _heat_stage(settings: Settings) -> dict:
    """Train and gate the heat GAN, then ask the champion what a burst on the first tenant's
    tenth-ranked key would do to its warm-up plan (figure in data/reports/heat_sim.png)."""
    from data_contracts.derived import read_demand
    from flows.heat.flow import train_heat_gan_flow
    from models.heat.registry import heat_panel, load_champion_gan
    from models.heat.simulate import Event, simulate, simulation_figure

    result = train_heat_gan_flow(
        data_dir=str(settings.data_dir), mlflow_uri=settings.mlflow_uri,
        mlflow_artifacts=str(settings.mlflow_artifacts), top_k=20, epochs=3,
    )  # fmt: skip
    out = {key: result[key] for key in ("version", "promoted", "reason")}
    try:
        module, meta, _ = load_champion_gan(settings.mlflow_uri)
    except LookupError:  # the gate rejected the first model: nothing to simulate with
        return out
    demand = read_demand(settings.data_dir / "features", str(meta["granularity"]))
    tenant = sorted(str(t) for t in demand["tenant"].unique())[0]
    panel = heat_panel(demand[demand["tenant"] == tenant], module.config.half_life_buckets, 20)
    plain = simulate(module, panel.heat, panel.keys, n_paths=32, top_k=len(panel.keys))
    ranked = plain.summary["baseline_top"]  # every key, hottest first
    key = ranked[min(9, len(ranked) - 1)]  # the tenth: just outside a top-5 plan
    burst = simulate(module, panel.heat, panel.keys, 32, events=[Event(0, key, 1.0)], top_k=5)
    plot = settings.data_dir / "reports" / "heat_sim.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    simulation_figure(burst).savefig(plot, dpi=100)
    moved = burst.summary["keys"][key]
    return out | {
        "simulated": {"tenant": tenant, "key": key, "event": f"0:{key}:1.0",
                      "entered_top_5": burst.summary["entered"],
                      "rank_before": moved["rank_before"], "rank_after": moved["rank_after"]},
    }  # fmt: skip


def _llm_stage(settings: Settings) -> dict[str, str]:
    """Register the tiny GPT-2 as `preheat-llm` unless a champion exists, so `make serve`'s
    warm-up and deploy-models have a model after the demo (a user's own stays champion)."""
    import mlflow

    from flows.cli.model_registry import register_tiny_llm
    from models.llm.registry import MODEL_NAME

    client = mlflow.MlflowClient(settings.mlflow_uri)
    try:
        return {"champion": str(client.get_model_version_by_alias(MODEL_NAME, "champion").version)}
    except mlflow.exceptions.MlflowException:
        pass
    artifacts = settings.mlflow_artifacts
    return {"champion": register_tiny_llm(settings.data_dir, settings.mlflow_uri, artifacts)}


def run_demo(settings: Settings, log: Path | None, days: float, console: Console) -> dict:
    """Run every stage; returns (and writes to <data_dir>/reports/demo_summary.json) a summary."""
    from flows.features.flow import features_flow
    from flows.ingest.flow import ingest_flow
    from models.evaluation.demo_cache import run_cache_stage
    from models.evaluation.demo_replay import run_replay_stage

    started = time.perf_counter()
    spec = SyntheticLogSpec(days=days)
    if log is None:
        log = settings.data_dir / "demo" / "requests.jsonl"
        with console.status("generating a synthetic multi-tenant request log"):
            count = write_synthetic_log(log, spec)
        console.print(f"generated {count} requests over {days:g} days -> {log}")
    with console.status("flow ingest: validating the log into the lake"):
        ingested = ingest_flow(paths=[str(log)], data_dir=str(settings.data_dir))
    console.print(
        f"ingest: read {ingested['read']}, accepted {ingested['accepted']}, "
        f"quarantined {ingested['quarantined']}"
    )
    lake = Lake(settings.data_dir / "lake")
    with RedisHandle(settings.redis_url) as redis_url:
        with console.status("flow ingest-stream: live traffic through Redis Streams"):
            streamed = _stream_live_traffic(settings, spec, console, redis_url)
        console.print(f"ingest-stream: {streamed['written']} new rows, {streamed['acked']} acked")
        with console.status("flow features: demand series at 5 s, 3 min, 1 h"):
            feature_rows = features_flow(data_dir=str(settings.data_dir))
        console.print(f"features: {feature_rows}")
        with console.status("flow train-forecaster: attention vs baselines, MLflow champion"):
            forecast = _forecast_stage(settings)
        console.print(
            f"train-forecaster: v{forecast['version']} chose {forecast['chosen']}, "
            f"{forecast['reason']}"
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
            llm = _llm_stage(settings)
        console.print(f"registry: preheat-llm@champion is version {llm['champion']}")
        with console.status("replay: the latest traffic, warm-up off and on, 3 restarts"):
            replay = run_replay_stage(lake, settings, console)
        with console.status("cache: KV pages of the top templates, tiny GPT-2, three tiers"):
            prompts = lake.read("requests", columns=["tenant", "template_id", "prompt"])
            cache = run_cache_stage(prompts, settings.data_dir / "cache", redis_url, console)
    summary = _summary_tables(lake, settings, console)
    summary.update(
        ingested={k: ingested[k] for k in ("read", "accepted", "quarantined")},
        streamed=streamed,
        cache=cache,
        forecast=forecast,
        heat=heat,
        llm=llm,
        replay=replay,
        wall_seconds=round(time.perf_counter() - started, 1),
    )
    report = settings.data_dir / "reports" / "demo_summary.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    console.print(f"demo finished in {summary['wall_seconds']} s; summary -> {report}")
    return summary

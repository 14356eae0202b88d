"""The demo's steps around its flows: live traffic in, the champions asked, the lake summarised.

`preheat demo` (`flows.demo`) runs the flows and prints one line a stage; what a stage does
besides calling a flow is here, so it can be called without Prefect: send an hour of live
traffic through the request stream's producer, ask the champion forecaster for the hottest keys
and the champion heat GAN what a burst would do, find the registered LLM (registering the tiny
demo GPT-2 when there is none), and the closing tables.
The cache and replay stages are `demo_cache` and `demo_replay` beside this module.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import redis
from rich.console import Console
from rich.table import Table

from cache_runtime.request_stream import RequestLogProducer
from cache_runtime.settings import Settings
from data_contracts.derived import read_demand
from data_contracts.lake import Lake
from models.ingest.synthetic import SyntheticLogSpec, generate_requests


def send_live_traffic(settings: Settings, spec: SyntheticLogSpec, url: str) -> int:
    """One hour of fresh traffic after `spec`'s, through the producer into the stream at `url`;
    returns the requests sent (the `ingest-stream` flow drains them)."""
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
    return producer.stats.sent


def predicted_hottest(settings: Settings) -> list[dict[str, Any]]:
    """The champion forecaster's three hottest named keys over its horizon (none while gating
    has rejected every model: nothing is deployed yet)."""
    from models.forecast.registry import load_champion

    demand = read_demand(settings.data_dir / "features", "3min")
    try:
        forecast = load_champion(settings.mlflow_uri).predict_per_key(demand)
    except LookupError:  # gating rejected the first model: nothing is deployed yet
        return []
    named = forecast[~forecast["key"].str.startswith("__")]
    top = named.groupby(["tenant", "key"], observed=True)["predicted"].sum().nlargest(3)
    return [
        {"tenant": str(t), "key": str(k), "next_30_min": round(float(v), 1)}
        for (t, k), v in top.items()
    ]


def simulate_burst(settings: Settings) -> dict[str, Any] | None:
    """What the champion heat GAN says a burst on the first tenant's tenth-ranked key would do
    to its warm-up plan (figure in <data_dir>/reports/heat_sim.png); None without a champion."""
    from models.heat.registry import heat_panel, load_champion_gan
    from models.heat.simulate import Event, simulate, simulation_figure

    try:
        module, meta, _ = load_champion_gan(settings.mlflow_uri)
    except LookupError:  # the gate rejected the first model: nothing to simulate with
        return None
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
    return {"tenant": tenant, "key": key, "event": f"0:{key}:1.0",
            "entered_top_5": burst.summary["entered"],
            "rank_before": moved["rank_before"], "rank_after": moved["rank_after"]}  # fmt: skip


def llm_champion(settings: Settings) -> str | None:
    """The version `preheat-llm@champion` points at, None when no version holds the alias."""
    import mlflow

    from models.llm.registry import MODEL_NAME

    client = mlflow.MlflowClient(settings.mlflow_uri)
    try:
        return str(client.get_model_version_by_alias(MODEL_NAME, "champion").version)
    except mlflow.exceptions.MlflowException:
        return None


def register_tiny_llm(data_dir: Path, mlflow_uri: str, artifacts: Path) -> str:
    """Save the tiny demo GPT-2 (built from a config: real KV mechanics, meaningless text)
    under `<data_dir>/models/tiny-gpt2` and register it; returns the version."""
    from models.llm.registry import register_llm, save_tiny_llm

    return register_llm(save_tiny_llm(data_dir / "models" / "tiny-gpt2"), mlflow_uri, artifacts)


def ensure_llm_champion(settings: Settings) -> str:
    """The version of `preheat-llm@champion`, registering the tiny GPT-2 first when no version
    holds the alias, so `make serve`'s warm-up and deploy-models have a model after the demo (a
    user's own model stays champion)."""
    version = llm_champion(settings)
    if version is not None:
        return version
    return register_tiny_llm(settings.data_dir, settings.mlflow_uri, settings.mlflow_artifacts)


def summary_tables(lake: Lake, settings: Settings, console: Console) -> dict[str, Any]:
    """Print the lake's requests by tenant and the top keys by demand; returns the summary's
    figures (requests, tenants, quarantined rows, feature rows, the daily tide, the burst)."""
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

"""The gateway's Prometheus metrics — the twelve dimensions of issue 9 — beside the cache's, in
one `/metrics` exposition.

Every metric is defined here, its meaning in `HELP` (the exposition's help text and the README's
table); `models.serving.signals` computes them from what the gateway observes. Counters and
histograms are updated per request; the gauges marked *window* are computed when scraped over
the last `metrics_window_s` (default 300 s), so they answer "now" without PromQL, while the
counters beside them give any other window with `rate()`.

| dimension | metric(s) |
|---|---|
| request latency | `preheat_gateway_request_seconds` |
| hit ratio per tier and key kind | `preheat_gateway_hit_ratio` (+ `_hits`, `_lookups`) |
| forecast error | `preheat_gateway_forecast_mape_percent` (+ `_forecast_points`) |
| warm-up QPS gain | `preheat_gateway_warmup_qps_gain` (+ `_warmup_qps`) |
| cold-start time | `preheat_gateway_cold_start_seconds` |
| accelerator memory | `preheat_gateway_accelerator_memory_bytes` |
| feature-load latency | `preheat_gateway_feature_load_seconds` |
| SLA deviation | `preheat_gateway_sla_violation_ratio`, `_sla_p95_excess_seconds` |
| A/B attribution of hits | `preheat_gateway_attributed_hits_total`, `_warmup_hit_share` |
| canary traffic share | `preheat_gateway_canary_share` (+ `_canary_requests_total`) |
| cost share per tenant | `preheat_gateway_tenant_cost_share` (+ `_model_seconds_total`) |
| ROI with time decay | `preheat_gateway_warmup_roi` (+ `_warmup_value`, `_warmup_cost`) |

Each registry is the app's own (as `cache_runtime.metrics`): two apps in one process never share
counters. Tenants appear only as `tenant_label` makes them (module `signals`): a keyed hash by
default, since `/metrics` is scraped without a key and tenant names may be confidential.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# From a memory hit (~1 ms) to a long CPU generation.
_BUCKETS = (5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LOAD_BUCKETS = (1e-3, 1e-2, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

HELP: dict[str, str] = {
    "preheat_gateway_request_seconds": "Time from the request reaching the handler to its "
    "response (first byte when streamed), by route and outcome (the x-preheat-cache value, "
    "`canary`, or an error kind).",
    "preheat_gateway_hits": "Answers served from a cache, by tier (memory, ssd, redis; kv for "
    "prefix pages) and key kind (exact, semantic, prefix, embedding).",
    "preheat_gateway_lookups": "Cache lookups the gateway made, by key kind: exact per "
    "cacheable request, semantic after an exact miss, prefix per model call with the cache, "
    "embedding per input.",
    "preheat_gateway_hit_ratio": "Window: hits of the kind answered by the tier / lookups of "
    "that kind (summed over tiers: the kind's hit ratio). NaN without lookups.",
    "preheat_gateway_forecast_mape_percent": "Window (forecast_window_s): MAPE of the "
    "champion's per-key demand forecast against the requests seen per (tenant, key, bucket), "
    "over completed buckets with actual > 0. NaN without such a point.",
    "preheat_gateway_forecast_points": "The (tenant, key, bucket) terms the MAPE averaged.",
    "preheat_gateway_warmup_qps": "Window: requests per second answered whole (exact) from "
    "entries warm-up wrote.",
    "preheat_gateway_warmup_qps_gain": "Window: warmed exact hits / requests the model "
    "answered: the relative QPS a model-bound node gains, since without warm-up each warmed "
    "hit would have been a model call. NaN when the model answered none.",
    "preheat_gateway_cold_start_seconds": "Phase `load`: building the gateway (model, "
    "MiniLM, cache); `first_request`: latency of the first request; `first_hit`: from ready to "
    "the first answer served from a cache. NaN until it happened.",
    "preheat_gateway_accelerator_memory_bytes": "Memory by device and source: cuda_allocated "
    "and cuda_reserved per initialised CUDA device; process_rss (or process_peak_rss) always.",
    "preheat_gateway_feature_load_seconds": "Time to load what the gateway reads, by what: "
    "model, minilm, templates, calibration, warmup_ledgers, forecast.",
    "preheat_gateway_slo_seconds": "The latency SLO the SLA metrics compare with (slo_s).",
    "preheat_gateway_sla_violation_ratio": "Window: share of answered requests (not 4xx) "
    "slower than the SLO, by route.",
    "preheat_gateway_sla_p95_excess_seconds": "Window: p95 latency minus the SLO, by route "
    "(negative: headroom).",
    "preheat_gateway_attributed_hits": "Cache hits by key kind and by who wrote the entry "
    "(warmup: the warm-up ledgers stored it and traffic has not rewritten it; traffic).",
    "preheat_gateway_warmup_hit_share": "Window: hits on entries warm-up wrote / all hits.",
    "preheat_gateway_canary_requests": "Cache-eligible generation requests by group: canary "
    "(the control group, served with the cache off) or cached.",
    "preheat_gateway_canary_share": "Window: canary requests / cache-eligible generation "
    "requests: the control group's observed share (canary_share sets the target).",
    "preheat_gateway_model_seconds": "Model compute seconds by tenant (generation calls and "
    "MiniLM encodes of embedding misses).",
    "preheat_gateway_tenant_cost_share": "Window: a tenant's model compute seconds / all "
    "tenants' (sums to 1 over tenants). NaN with no compute.",
    "preheat_gateway_warmup_roi": "(value of latency saved by warmed hits - warm-up cost) / "
    "warm-up cost, every contribution decayed with half-life roi_half_life_s. NaN before any "
    "warm-up cost is known.",
    "preheat_gateway_warmup_value": "Decayed value of the latency warmed hits saved: saved "
    "model seconds x roi_value_per_saved_s.",
    "preheat_gateway_warmup_cost": "Decayed warm-up cost: the ledgers' compute seconds x "
    "roi_cost_per_compute_s.",
    "preheat_gateway_degraded": "Failures absorbed without failing the request (semantic "
    "lookup or store, request log, warm-up ledgers, forecast, metrics).",
}

# The gauges computed at scrape time, with their label names.
DERIVED: dict[str, tuple[str, ...]] = {
    "preheat_gateway_hit_ratio": ("tier", "kind"),
    "preheat_gateway_forecast_mape_percent": ("granularity",),
    "preheat_gateway_forecast_points": ("granularity",),
    "preheat_gateway_warmup_qps": (),
    "preheat_gateway_warmup_qps_gain": (),
    "preheat_gateway_cold_start_seconds": ("phase",),
    "preheat_gateway_accelerator_memory_bytes": ("device", "source"),
    "preheat_gateway_slo_seconds": (),
    "preheat_gateway_sla_violation_ratio": ("route",),
    "preheat_gateway_sla_p95_excess_seconds": ("route",),
    "preheat_gateway_warmup_hit_share": (),
    "preheat_gateway_canary_share": (),
    "preheat_gateway_tenant_cost_share": ("tenant",),
    "preheat_gateway_warmup_roi": (),
    "preheat_gateway_warmup_value": (),
    "preheat_gateway_warmup_cost": (),
}
Samples = dict[str, list[tuple[tuple[str, ...], float]]]  # name -> (label values, value)


class _DerivedGauges(Collector):
    """The `DERIVED` gauges, computed by `source` on each scrape."""

    def __init__(self, source: Callable[[], Samples]) -> None:
        self._source = source

    def describe(self) -> Iterable[Metric]:
        # Without it, registering would call `collect` (auto_describe) before the app is built.
        return [GaugeMetricFamily(n, HELP[n], labels=list(ls)) for n, ls in DERIVED.items()]

    def collect(self) -> Iterator[Metric]:
        values = self._source()
        for name, labels in DERIVED.items():
            family = GaugeMetricFamily(name, HELP[name], labels=list(labels))
            for label_values, value in values.get(name, []):
                family.add_metric(list(label_values), value)
            yield family


class GatewayMetrics:
    """The per-request counters and histograms; `attach` adds the scrape-time gauges."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry

        def counter(name: str, *labels: str) -> Counter:
            return Counter(f"preheat_gateway_{name}", HELP[f"preheat_gateway_{name}"], labels,
                           registry=r)  # fmt: skip

        def histogram(name: str, buckets: tuple[float, ...], *labels: str) -> Histogram:
            return Histogram(f"preheat_gateway_{name}", HELP[f"preheat_gateway_{name}"], labels,
                             buckets=buckets, registry=r)  # fmt: skip

        self.latency = histogram("request_seconds", _BUCKETS, "route", "outcome")
        self.hits = counter("hits", "tier", "kind")
        self.lookups = counter("lookups", "kind")
        self.attributed = counter("attributed_hits", "kind", "writer")
        self.canary = counter("canary_requests", "group")
        self.model_seconds = counter("model_seconds", "tenant")
        self.feature_load = histogram("feature_load_seconds", _LOAD_BUCKETS, "what")
        self.degraded = counter("degraded", "component")

    def attach(self, source: Callable[[], Samples]) -> None:
        """Register the scrape-time gauges, computed by `source`."""
        self.registry.register(_DerivedGauges(source))

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def tenant_label(tenant: str, mode: Literal["hashed", "name"], salt: str = "") -> str:
    """The tenant as metrics and spans show it: its name, or `t-` and 12 hex digits of a
    BLAKE2b keyed with `salt` (stable across restarts with the same salt; with a secret salt,
    a list of guessed tenant names cannot be confirmed against the labels)."""
    if mode == "name":
        return tenant
    key = salt.encode()[:64]
    return "t-" + hashlib.blake2b(tenant.encode(), key=key, digest_size=6).hexdigest()


def exposition(registries: Iterable[CollectorRegistry]) -> bytes:
    """The Prometheus text format of several registries, concatenated (their metric names are
    distinct: `preheat_cache_*` and `preheat_gateway_*`)."""
    return b"".join(generate_latest(r) for r in registries)

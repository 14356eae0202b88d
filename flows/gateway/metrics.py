"""The gateway's Prometheus metrics, beside the cache's, in one `/metrics` exposition.

Each in its own registry (as `cache_runtime.metrics`): two apps in one process — tests, or a
benchmark next to the app — never share counters. No tenant label: `/metrics` is scraped
without a key, and a label per tenant would tell anyone who can reach it who the tenants are.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

# From a memory hit (~1 ms) to a long CPU generation.
_BUCKETS = (5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class GatewayMetrics:
    """Request latency by route and outcome; hits by tier and key kind; what degraded."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram(
            "preheat_gateway_request_seconds",
            "Time from the request reaching the handler to its response (first byte when "
            "streamed), by route and outcome (the x-preheat-cache value, or an error kind).",
            ["route", "outcome"], buckets=_BUCKETS, registry=r,
        )  # fmt: skip
        self.hits = Counter(
            "preheat_gateway_hits",
            "Answers served from a cache, by tier (memory, ssd, redis; kv for prefix pages) "
            "and key kind (exact, semantic, prefix, embedding).",
            ["tier", "kind"], registry=r,
        )  # fmt: skip
        self.degraded = Counter(
            "preheat_gateway_degraded",
            "Failures absorbed without failing the request (semantic lookup, request log).",
            ["component"], registry=r,
        )  # fmt: skip

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def exposition(registries: Iterable[CollectorRegistry]) -> bytes:
    """The Prometheus text format of several registries, concatenated (their metric names are
    distinct: `preheat_cache_*` and `preheat_gateway_*`)."""
    return b"".join(generate_latest(r) for r in registries)

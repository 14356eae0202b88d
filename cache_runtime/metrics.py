"""Prometheus metrics of one cache instance, in a registry the instance owns.

No global registry: two caches in one process (two models, or a test beside the app) must not
share or clash on counters. Expose with `prometheus_client.generate_latest(cache.metrics.registry)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from cache_runtime.pool import PoolPolicy

_LATENCY_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0)


class CacheMetrics:
    """Counters by tier and key kind (exact / semantic / prefix / embedding / other). Lookups
    with tier=generations result=unvalidated: answers that missed as their generations could not
    be read; result=stale: a copy stored before an invalidation, dropped."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.lookups = Counter(
            "preheat_cache_lookups", "Lookups answered by a tier (result=hit) or passed on (miss).",
            ["tier", "kind", "result"], registry=r,
        )  # fmt: skip
        self.writes = Counter(
            "preheat_cache_writes",
            "Values written to a tier (stored or refused); tier=all result=superseded: an answer"
            " invalidated since the caller's lookup, not written; result=unvalidated: an answer"
            " not written as its generations could not be read (Redis down).",
            ["tier", "kind", "result"], registry=r,
        )  # fmt: skip
        self.promotions = Counter(
            "preheat_cache_promotions", "Values copied up into this tier after a hit below it.",
            ["tier"], registry=r,
        )  # fmt: skip
        self.demotions = Counter(
            "preheat_cache_demotions", "Values moved down into this tier when evicted above it.",
            ["tier"], registry=r,
        )  # fmt: skip
        self.evictions = Gauge(
            "preheat_cache_evictions",
            "Evictions by the tier since it was opened.",
            ["tier"],
            registry=r,
        )
        self.bytes = Gauge("preheat_cache_bytes", "Bytes held by the tier.", ["tier"], registry=r)
        self.errors = Counter(
            "preheat_cache_errors", "Tier failures absorbed by the cache (the request went on).",
            ["tier", "op"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "preheat_cache_op_seconds", "Latency of one tier operation.", ["tier", "op"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.degraded = Gauge(
            "preheat_cache_degraded",
            "1 while a component is degraded (see `HybridCache.health`), else 0.",
            ["component"], registry=r,
        )  # fmt: skip
        self.refills = Counter(
            "preheat_cache_refills", "Background refills after invalidation, by outcome.",
            ["result"], registry=r,
        )  # fmt: skip

        # the memory tier's pool (`pool.PoolPolicy`): what it decided, read when scraped
        self.policy_leader = Gauge(
            "preheat_cache_policy_leader",
            "1 for the pool candidate whose policy the memory tier follows now, 0 for the others.",
            ["tier", "policy"], registry=r,
        )  # fmt: skip
        self.policy_switches = Gauge(
            "preheat_cache_policy_switches",
            "Times the memory tier's pool moved to another candidate since the tier opened.",
            ["tier"], registry=r,
        )  # fmt: skip
        self.policy_sample_rate = Gauge(
            "preheat_cache_policy_sample_rate",
            "Share of keys the pool's shadows replay (0 until the tier has filled once).",
            ["tier"], registry=r,
        )  # fmt: skip

    def publish_pool(self, tier: str, pool: PoolPolicy) -> None:
        """The pool's leader, switches and sampling rate as gauges: which policy evicts, and
        how often it changed (a pool that switches every few minutes is one to look at). Read
        without the tier's lock, so as not to hold up its puts for a scrape: each value is
        whole, but a switch under way may show its new leader one scrape before its count."""
        leader = pool.leader_name
        for name in pool.pool:
            self.policy_leader.labels(tier, name).set(int(name == leader))
        self.policy_switches.labels(tier).set(len(pool.switches))
        self.policy_sample_rate.labels(tier).set(pool.effective_rate or 0.0)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (tests, summaries); 0 when never set."""
        return self.registry.get_sample_value(name, labels) or 0.0

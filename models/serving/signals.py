"""`Signals`: what the gateway observes, turned into the twelve metrics of
`cache_runtime/serving/metrics.py`.

The chain reports lookups and hits as they happen; the service reports each finished request
(`generation`, `embeddings`) and the app its latency (`finished`). Who wrote a hit's entry comes
from the warm-up ledgers (`cache_runtime/serving/warmed.py`), what it saved from the timed model
calls (`savings.py`), the forecast error from the champion's forecast (`forecast_error.py`). The
scrape-time gauges are computed in `samples`; definitions and meanings are in `metrics.py`.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cache_runtime.keys import EmbeddingKey
from cache_runtime.node_cache import EMBEDDING_MODEL_ID
from cache_runtime.serving.metrics import GatewayMetrics, Samples, tenant_label
from cache_runtime.serving.system import accelerator_memory
from cache_runtime.serving.windows import Clock, RecentLatencies, SlidingCounts, quantile
from models.serving.forecast_error import ForecastError, demand_key, first_block_hash
from models.serving.savings import Roi, Savings

if TYPE_CHECKING:
    import pandas as pd

    from cache_runtime.serving.warmed import WarmupLedgers
    from models.serving.chain import Served

MODEL_ANSWERED = frozenset({"miss", "prefix", "bypass", "canary"})
ForecastLoader = Callable[[], "tuple[pd.DataFrame, float] | None"]  # (KeyForecast, bucket s)


@dataclass(frozen=True)
class SignalSettings:
    """The metrics' knobs (`GatewayConfig` documents each)."""

    window_s: float = 300.0
    slo_s: float = 1.0
    canary_share: float = 0.0
    tenant_label: Literal["hashed", "name"] = "hashed"
    tenant_salt: str = ""
    value_per_saved_s: float = 1.0
    cost_per_compute_s: float = 1.0
    roi_half_life_s: float = 86_400.0
    forecast_window_s: float = 3_600.0
    forecast_refresh_s: float = 600.0


class Signals:
    """The gateway's observations and the metrics computed from them (module docstring).

    `clock` (monotonic) times windows and the cold start, `wall` (epoch seconds, as the
    ledgers record) dates the ROI's contributions and the forecast's buckets; both are
    injectable so tests move time instead of sleeping.
    """

    def __init__(
        self,
        metrics: GatewayMetrics,
        settings: SignalSettings,
        *,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.metrics, self.settings, self._clock = metrics, settings, clock
        self.window = SlidingCounts(settings.window_s, clock)
        self.latencies = RecentLatencies(settings.window_s, clock)
        self.roi = Roi(settings.value_per_saved_s, settings.cost_per_compute_s,
                       settings.roi_half_life_s, wall)  # fmt: skip
        self.savings = Savings(self.roi, wall)
        self.forecast = ForecastError(settings.forecast_window_s, wall)
        self.ledgers: WarmupLedgers | None = None
        self.forecast_loader: ForecastLoader | None = None
        self._rng = rng or random.Random()
        self._ready = clock()
        self._cold: dict[str, float] = {}
        self._hit_pairs: set[tuple[str, str]] = set()
        self._pairs_lock = threading.Lock()
        self._forecast_due = -math.inf
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        metrics.attach(self.samples)

    # -- from the chain -------------------------------------------------------------------------

    def lookup(self, kind: str) -> None:
        self.metrics.lookups.labels(kind).inc()
        self.window.add(("lookup", kind))

    def hit(self, tier: str, kind: str) -> None:
        self.metrics.hits.labels(tier, kind).inc()
        self.window.add(("hit", tier, kind))
        if (tier, kind) not in self._hit_pairs:  # rare: a scrape may be iterating the set
            with self._pairs_lock:
                self._hit_pairs.add((tier, kind))

    def canary_draw(self) -> bool:
        """Whether a cache-eligible generation request joins the control group."""
        return self.settings.canary_share > 0 and self._rng.random() < self.settings.canary_share

    # -- from the service -----------------------------------------------------------------------

    def generation(
        self, tenant: str, route: str, served: Served, ids: list[int] | None, eligible: bool
    ) -> None:
        """One answered chat/completion request (`ids`: its prompt's tokens, when known)."""
        outcome = served.outcome
        if eligible:
            group = "canary" if outcome == "canary" else "cached"
            self.metrics.canary.labels(group).inc()
            self.window.add(("canary", group))
        if outcome in MODEL_ANSWERED:
            self.window.add(("model",))
            self._compute(tenant, served.model_s)
            self.savings.model_call(served.prompt_tokens, served.cached_tokens,
                                    served.completion_tokens, served.model_s)  # fmt: skip
        kind, writer = self._writer(tenant, served, ids)
        if kind is not None:
            self._attributed(kind, writer)
            if writer == "warmup":
                if kind == "exact":
                    self.window.add(("warmed_exact",))
                self.savings.warmed_hit(kind, served.prompt_tokens, served.completion_tokens,
                                        served.cached_tokens)  # fmt: skip
        if outcome in ("miss", "prefix") and self.ledgers is not None:
            if served.key is not None:
                self.ledgers.traffic_wrote(served.key)
            if ids:
                self.ledgers.traffic_wrote_pages(tenant, ids, served.cached_tokens)
        first = first_block_hash(ids)
        self.forecast.observe(tenant, demand_key(served.template, first, route))

    def embeddings(
        self, tenant: str, texts: list[str], outcomes: list[str], encode_s: float
    ) -> None:
        """One answered embeddings request: per input a lookup, a hit or a stored miss."""
        misses = 0
        for text, outcome in zip(texts, outcomes, strict=True):
            self.forecast.observe(tenant, "route:embeddings")
            if outcome == "bypass":
                continue
            self.lookup("embedding")
            key = EmbeddingKey.of(tenant, EMBEDDING_MODEL_ID, text).to_string()
            if outcome.startswith("exact-"):
                self.hit(outcome.removeprefix("exact-"), "embedding")
                writer = self.ledgers.exact_writer(key) if self.ledgers else "traffic"
                self._attributed("embedding", writer)
                if writer == "warmup":
                    self.savings.warmed_hit("embedding")
            else:
                misses += 1
                if self.ledgers is not None:
                    self.ledgers.traffic_wrote(key)
        computed = misses or sum(o == "bypass" for o in outcomes)
        if computed:
            self._compute(tenant, encode_s)
            self.savings.embedding_call(computed, encode_s)

    def _writer(self, tenant: str, served: Served, ids: list[int] | None) -> tuple[str | None, str]:
        """(hit kind or None, who wrote the entry it was served from)."""
        outcome = served.outcome
        if outcome.startswith("exact-") and served.key is not None:
            writer = self.ledgers.exact_writer(served.key) if self.ledgers else "traffic"
            return "exact", writer
        if outcome.startswith("semantic-"):
            return "semantic", "traffic"  # warm-up stores no semantic entries
        if outcome == "prefix":
            if self.ledgers is None or not ids:
                return "prefix", "traffic"
            return "prefix", self.ledgers.prefix_writer(tenant, ids, served.cached_tokens)
        return None, "traffic"

    def _attributed(self, kind: str, writer: str) -> None:
        self.metrics.attributed.labels(kind, writer).inc()
        self.window.add(("attributed", writer))

    def _compute(self, tenant: str, seconds: float) -> None:
        if seconds > 0:
            label = self.label(tenant)
            self.metrics.model_seconds.labels(label).inc(seconds)
            self.window.add(("compute", label), seconds)

    def label(self, tenant: str) -> str:
        return tenant_label(tenant, self.settings.tenant_label, self.settings.tenant_salt)

    @property
    def wants_tokens(self) -> bool:
        """Whether a prompt's tokens are worth computing for the metrics (forecast keys, KV
        page attribution)."""
        return self.forecast.granularity is not None or (
            self.ledgers is not None and self.ledgers.has_pages
        )

    # -- from the app ---------------------------------------------------------------------------

    def ready(self, began: float) -> None:
        """The gateway is built (`began`: `clock()` when building started)."""
        self._ready = self._clock()
        self._cold["load"] = self._ready - began

    def finished(self, route: str, outcome: str, seconds: float) -> None:
        """A request's latency: SLA (4xx excluded: the client's error) and cold start."""
        self.metrics.latency.labels(route, outcome).observe(seconds)
        if outcome.startswith("error_4"):
            return
        self.latencies.add(route, seconds)
        self._cold.setdefault("first_request", seconds)
        if "first_hit" not in self._cold and _is_hit(outcome):
            self._cold["first_hit"] = self._clock() - self._ready

    def feature_load(self, what: str, seconds: float) -> None:
        self.metrics.feature_load.labels(what).observe(seconds)

    # -- refreshing -----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read new warm-up ledger rows; reload the forecast when due. Failures are counted."""
        with self._refresh_lock:
            if self.ledgers is not None:
                self._timed("warmup_ledgers", self.ledgers.refresh)
            due = self._clock() >= self._forecast_due
            if self.forecast_loader is not None and due:
                self._forecast_due = self._clock() + self.settings.forecast_refresh_s
                loaded = self._timed("forecast", self.forecast_loader)
                if loaded is not None:
                    self.forecast.set_forecast(*loaded)

    def _timed(self, what: str, load: Callable[[], object]) -> object:
        started = time.perf_counter()
        try:
            result = load()
        except Exception:
            self.metrics.degraded.labels(what).inc()
            return None
        self.feature_load(what, time.perf_counter() - started)
        return result

    def start(self, interval_s: float) -> None:
        """Refresh now and every `interval_s` in a daemon thread until `close`."""

        def loop() -> None:
            while not self._stop.is_set():
                self.refresh()
                self._stop.wait(interval_s)

        threading.Thread(target=loop, name="preheat-gateway-signals", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    # -- the scrape-time gauges -----------------------------------------------------------------

    def samples(self) -> Samples:
        t, s = self.window.totals(), self.settings
        share = lambda part, whole: part / whole if whole > 0 else math.nan  # noqa: E731
        lookups = {k[1]: v for k, v in t.items() if k[0] == "lookup"}
        with self._pairs_lock:
            pairs = sorted(self._hit_pairs)
        ratios = [((tier, kind), share(t.get(("hit", tier, kind), 0.0), lookups.get(kind, 0.0)))
                  for tier, kind in pairs]  # fmt: skip
        mape, points = self.forecast.mape()
        granularity = self.forecast.granularity or "none"
        warmed, model = t.get(("warmed_exact",), 0.0), t.get(("model",), 0.0)
        span = min(s.window_s, max(self._clock() - self._ready, 1e-9))
        recent = self.latencies.recent()
        warm_hits = t.get(("attributed", "warmup"), 0.0)
        hits = warm_hits + t.get(("attributed", "traffic"), 0.0)
        canary = t.get(("canary", "canary"), 0.0)
        compute = {k[1]: v for k, v in t.items() if k[0] == "compute"}
        total_compute = sum(compute.values())
        return {
            "preheat_gateway_hit_ratio": ratios,
            "preheat_gateway_forecast_mape_percent": [((granularity,), mape)],
            "preheat_gateway_forecast_points": [((granularity,), float(points))],
            "preheat_gateway_warmup_qps": [((), warmed / span)],
            "preheat_gateway_warmup_qps_gain": [((), share(warmed, model))],
            "preheat_gateway_cold_start_seconds": [
                ((phase,), self._cold.get(phase, math.nan))
                for phase in ("load", "first_request", "first_hit")
            ],
            "preheat_gateway_accelerator_memory_bytes": [
                ((device, source), value) for device, source, value in accelerator_memory()
            ],
            "preheat_gateway_slo_seconds": [((), s.slo_s)],
            "preheat_gateway_sla_violation_ratio": [
                ((route,), share(sum(x > s.slo_s for x in xs), len(xs)))
                for route, xs in sorted(recent.items())
            ],
            "preheat_gateway_sla_p95_excess_seconds": [
                ((route,), quantile(xs, 0.95) - s.slo_s) for route, xs in sorted(recent.items())
            ],
            "preheat_gateway_warmup_hit_share": [((), share(warm_hits, hits))],
            "preheat_gateway_canary_share": [
                ((), share(canary, canary + t.get(("canary", "cached"), 0.0)))
            ],
            "preheat_gateway_tenant_cost_share": [
                ((label,), share(v, total_compute)) for label, v in sorted(compute.items())
            ],
            "preheat_gateway_warmup_roi": [((), self.roi.roi())],
            "preheat_gateway_warmup_value": [((), self.roi.value())],
            "preheat_gateway_warmup_cost": [((), self.roi.cost())],
        }


def _is_hit(outcome: str) -> bool:
    """A response served (at least partly) from a cache: exact, semantic, KV prefix, or an
    embeddings batch with any cached input (`mixed`: some inputs hit, some did not)."""
    return outcome in ("prefix", "mixed") or any(
        part.startswith(("exact-", "semantic-")) for part in outcome.split(",")
    )

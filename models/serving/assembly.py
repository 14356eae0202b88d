"""Building a `Gateway` from a `GatewayConfig`: the model, the node cache, MiniLM, the log.

No FastAPI here: `flows.gateway.create_app` puts the HTTP routes in front of what
`build_gateway` returns, and a test or a benchmark can call the service without them.

Everything the caller passes in is used as given and stays the caller's to close (tests share
one model between apps; a benchmark injects its own cache); everything built here is closed
with the gateway. The cache is `cache_runtime.node_cache.node_cache` — the same tiers, paths and
Redis namespace warm-up writes to — so the gateway reads exactly what warm-up stored.

Each load (model, MiniLM, templates, calibration; later the warm-up ledgers and the forecast)
is timed into `preheat_gateway_feature_load_seconds`, and the whole build into the cold start.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cache_runtime import telemetry
from cache_runtime.serving.auth import KeyRing
from cache_runtime.serving.limits import TenantSlots
from cache_runtime.serving.metrics import GatewayMetrics
from cache_runtime.serving.warmed import WarmupLedgers
from models.serving.chain import Chain
from models.serving.embeddings import EmbeddingService, MiniLM
from models.serving.runners import InProcessRunner, Runner, UpstreamRunner
from models.serving.semantic import SemanticLayer
from models.serving.service import Gateway
from models.serving.signals import ForecastLoader, Signals, SignalSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from cache_runtime.hybrid import HybridCache
    from cache_runtime.request_stream import RequestLogProducer
    from cache_runtime.serving.config import GatewayConfig
    from models.templates.mined import MinedTemplates

_T = TypeVar("_T")


def open_runner(config: GatewayConfig) -> Runner:
    """The configured model: an upstream server, a local directory, the LLM `deploy-models` put
    on this node (the weights warm-up filled the cache for), or the registry's champion."""
    if config.backend == "openai":
        return UpstreamRunner(
            str(config.base_url), str(config.upstream_model), config.upstream_api_key,
            config.upstream_timeout_s,
        )  # fmt: skip
    from models.warmup.run import open_hf_backend

    backend = open_hf_backend(
        config.model_path, config.mlflow_uri, config.data_dir, device=config.device,
        purpose="to serve",
    )  # fmt: skip
    if config.decode_rows is not None:
        backend.decoder.rows = config.decode_rows  # (read by the decoder at each round)
    return InProcessRunner(backend)


def open_cache(config: GatewayConfig) -> HybridCache:
    from cache_runtime.node_cache import node_cache, node_settings

    settings = node_settings(config.data_dir, config.redis_url)
    return node_cache(
        settings, config.memory_bytes, config.ssd_bytes, config.redis_namespace,
        session_idle_end_s=config.session_idle_end_s or None,
    )  # fmt: skip


def open_producer(config: GatewayConfig) -> RequestLogProducer | None:
    """The live request log (None without Redis: there is no stream to write to)."""
    if not (config.log_requests and config.redis_url):
        return None
    import redis

    from cache_runtime.request_stream import RequestLogProducer

    client = redis.Redis.from_url(config.redis_url, socket_timeout=1, socket_connect_timeout=1)
    return RequestLogProducer(
        client, config.request_stream, config.request_stream_maxlen,
        spool_dir=Path(config.data_dir) / "spool",
    )  # fmt: skip


def load_templates(data_dir: Path) -> dict[str, MinedTemplates]:
    """Per tenant, the assigner of the mined templates table (empty when none was mined)."""
    from models.templates.mined import load_assigners

    return load_assigners(data_dir)


def _threshold(config: GatewayConfig) -> Any:
    if config.calibration_file is None:
        return config.semantic_threshold
    from models.templates.semantic_calibration import Calibration

    return Calibration.from_json(Path(config.calibration_file).read_bytes())


def champion_forecast(config: GatewayConfig) -> ForecastLoader:
    """The champion's per-key forecast on the lake's demand features, as warm-up plans with
    (`models.warmup.prepare.load_forecast`); None while there are no features, no store or no
    champion (a store that does not exist is not created by looking)."""
    data_dir, uri = Path(config.data_dir), config.mlflow_uri

    def load() -> Any:
        from data_contracts import GRANULARITIES
        from models.warmup.prepare import load_forecast, missing_sqlite_store

        if not (data_dir / "features").is_dir() or missing_sqlite_store(uri):
            return None
        forecast, _, _, _ = load_forecast(data_dir, uri, "3min")  # (the champion's own wins)
        if forecast is None or forecast.empty:
            return None
        return forecast, float(GRANULARITIES[str(forecast["granularity"].iloc[0])])

    return load


def signal_settings(config: GatewayConfig) -> SignalSettings:
    return SignalSettings(
        config.metrics_window_s, config.slo_s, config.canary_share, config.tenant_label,
        config.tenant_label_salt, config.roi_value_per_saved_s, config.roi_cost_per_compute_s,
        config.roi_half_life_s, config.forecast_window_s, config.forecast_refresh_s,
    )  # fmt: skip


def _timed(signals: Signals, what: str, load: Callable[[], _T]) -> _T:
    started = time.perf_counter()
    result = load()
    signals.feature_load(what, time.perf_counter() - started)
    return result


@dataclass
class _Parts:
    """What a gateway is made of, injected or opened here; `closers` close what was opened."""

    runner: Runner
    cache: HybridCache
    minilm: MiniLM
    templates: dict[str, MinedTemplates]
    semantic: SemanticLayer | None
    producer: RequestLogProducer | None
    closers: list[Any]


def _semantic_layer(
    config: GatewayConfig, signals: Signals, cache: HybridCache, minilm: MiniLM
) -> SemanticLayer:
    """Verified semantic lookups over `cache`, MiniLM loaded and the threshold read (timed)."""
    from models.templates.embeddings import Embedder

    _timed(signals, "minilm", minilm.model)
    threshold = _timed(signals, "calibration", lambda: _threshold(config))
    return SemanticLayer(
        cache, Embedder(encode=minilm.encode), threshold, config.response_ttl_s,
        minilm.count, config.semantic_max_tokens,
    )  # fmt: skip


def _open_parts(
    config: GatewayConfig, signals: Signals, runner: Runner | None, cache: HybridCache | None,
    minilm: MiniLM | None, producer: RequestLogProducer | None,
) -> _Parts:  # fmt: skip
    """Open what the caller did not pass; on a failure close what was opened, then raise."""
    closers: list[Any] = []
    try:
        if runner is None:
            runner = _timed(signals, "model", lambda: open_runner(config))
            closers.append(runner.close)
        if cache is None:
            cache = open_cache(config)
            closers.append(cache.close)
        minilm = minilm or MiniLM(config.device)
        # every answer's template (its generation scope, and its semantic namespace): read
        # with or without the semantic layer, as warm-up reads it
        templates = (
            _timed(signals, "templates", lambda: load_templates(config.data_dir))
            if config.templates else {}
        )  # fmt: skip
        semantic = _semantic_layer(config, signals, cache, minilm) if config.semantic else None
        if producer is None:
            producer = open_producer(config)
            if producer is not None:
                closers.append(producer.close)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    return _Parts(runner, cache, minilm, templates, semantic, producer, closers)


def build_gateway(
    config: GatewayConfig,
    *,
    runner: Runner | None = None,
    cache: HybridCache | None = None,
    minilm: MiniLM | None = None,
    producer: RequestLogProducer | None = None,
    keys: KeyRing | None = None,
    tracer_provider: TracerProvider | None = None,
    forecast_loader: ForecastLoader | None = None,
    rng: random.Random | None = None,
) -> Gateway:
    """A ready gateway (model and MiniLM loaded, so the first request pays no load).

    Args:
        tracer_provider: where spans go (default: `cache_runtime.telemetry`'s, off unless
            configured).
        forecast_loader: the forecast the MAPE compares with (default: the champion's).
        rng: the canary draw's random source.
    """
    began = time.monotonic()
    signals = Signals(GatewayMetrics(), signal_settings(config), rng=rng)
    tracer = (
        tracer_provider.get_tracer("preheat.gateway") if tracer_provider is not None
        else telemetry.tracer("preheat.gateway")
    )  # fmt: skip
    keys = keys or KeyRing.load(config.keys_file, config.keys, config.admin_keys)
    parts = _open_parts(config, signals, runner, cache, minilm, producer)
    runner, cache, minilm, closers = parts.runner, parts.cache, parts.minilm, parts.closers
    signals.ledgers = WarmupLedgers(
        config.data_dir, runner.model_id, runner.tokens, signals.roi.compute_s.add
    )
    if forecast_loader is not None or config.forecast:
        signals.forecast_loader = forecast_loader or champion_forecast(config)
    chain = Chain(
        runner, cache, signals, parts.semantic, config.response_ttl_s, tracer, parts.templates
    )
    embeddings = EmbeddingService(
        cache, minilm.encode, minilm.count, tracer,
        config.max_embedding_inputs, config.max_embedding_input_chars,
    )  # fmt: skip
    slots = TenantSlots(config.tenant_concurrency, config.tenant_queue, config.retry_after_s)
    gateway = Gateway(
        keys, chain, cache, signals, config.served_model or runner.model_id,
        config.default_max_tokens, embeddings, parts.producer, closers, tracer, slots,
    )  # fmt: skip
    signals.ready(began)
    if config.refresh_s > 0:
        signals.start(config.refresh_s)
        closers.append(signals.close)  # (closed first: closers run in reverse)
    return gateway

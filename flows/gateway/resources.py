"""Building a `Gateway` from a `GatewayConfig`: the model, the node cache, MiniLM, the log.

Everything the caller passes in is used as given and stays the caller's to close (tests share
one model between apps; a benchmark injects its own cache); everything built here is closed
with the gateway. The cache is `flows.warmup.execute.node_cache` — the same tiers, paths and
Redis namespace warm-up writes to — so the gateway reads exactly what warm-up stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.gateway.auth import KeyRing
from flows.gateway.chain import Chain
from flows.gateway.embeddings import EmbeddingService, MiniLM
from flows.gateway.metrics import GatewayMetrics
from flows.gateway.runners import InProcessRunner, Runner, UpstreamRunner
from flows.gateway.semantic import SemanticLayer
from flows.gateway.service import Gateway

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from cache_runtime.request_stream import RequestLogProducer
    from flows.gateway.config import GatewayConfig
    from models.templates.mined import MinedTemplates


def open_runner(config: GatewayConfig) -> Runner:
    """The configured model: an upstream server, a local directory, or the registry's champion."""
    if config.backend == "openai":
        return UpstreamRunner(
            str(config.base_url), str(config.upstream_model), config.upstream_api_key,
            config.upstream_timeout_s,
        )  # fmt: skip
    from models.llm.backends import HFBackend

    if config.model_path is not None:
        return InProcessRunner(HFBackend.from_path(config.model_path, config.device))
    return InProcessRunner(HFBackend.from_registry(config.mlflow_uri, device=config.device))


def open_cache(config: GatewayConfig) -> HybridCache:
    from cache_runtime.settings import Settings
    from flows.warmup.execute import node_cache

    settings = Settings(data_dir=config.data_dir, redis_url=config.redis_url)
    return node_cache(settings, config.memory_bytes, config.ssd_bytes, config.redis_namespace)


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
    from data_contracts.templates import read_templates
    from models.templates.mined import MinedTemplates

    table = read_templates(Path(data_dir) / "features")
    return {
        str(tenant): MinedTemplates.from_frame(rows)
        for tenant, rows in table.groupby("tenant", observed=True)
    }


def _threshold(config: GatewayConfig) -> Any:
    if config.calibration_file is None:
        return config.semantic_threshold
    from models.templates.semantic_calibration import Calibration

    return Calibration.from_json(Path(config.calibration_file).read_bytes())


def build_gateway(
    config: GatewayConfig,
    *,
    runner: Runner | None = None,
    cache: HybridCache | None = None,
    minilm: MiniLM | None = None,
    producer: RequestLogProducer | None = None,
    keys: KeyRing | None = None,
) -> Gateway:
    """A ready gateway (model and MiniLM loaded, so the first request pays no load)."""
    closers: list[Any] = []
    try:
        keys = keys or KeyRing.load(config.keys_file, config.keys, config.admin_keys)
        if runner is None:
            runner = open_runner(config)
            closers.append(runner.close)
        if cache is None:
            cache = open_cache(config)
            closers.append(cache.close)
        minilm = minilm or MiniLM(config.device)
        semantic = None
        if config.semantic:
            from models.templates.embeddings import Embedder

            minilm.model()
            templates = load_templates(config.data_dir) if config.templates else {}
            semantic = SemanticLayer(
                cache, Embedder(encode=minilm.encode), _threshold(config), templates,
                config.response_ttl_s, minilm.count, config.semantic_max_tokens,
            )  # fmt: skip
        if producer is None:
            producer = open_producer(config)
            if producer is not None:
                closers.append(producer.close)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    metrics = GatewayMetrics()
    chain = Chain(runner, cache, metrics, semantic, config.response_ttl_s)
    return Gateway(
        keys, chain, cache, metrics, config.served_model or runner.model_id,
        config.default_max_tokens, EmbeddingService(cache, minilm.encode, minilm.count),
        producer, closers,
    )  # fmt: skip

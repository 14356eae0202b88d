"""The node's cache: memory, SSD and Redis tiers built from plain values (a warm-up task's spec,
a gateway's config), so every process on a node builds the same cache the same way."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from cache_runtime.settings import Settings

EMBEDDING_MODEL_ID = "all-minilm-l6-v2"  # the model id in every embedding cache key
DEFAULT_MEMORY_BYTES = 256 * 1_000_000
DEFAULT_SSD_BYTES = 2048 * 1_000_000


def node_settings(data_dir: str | Path, redis_url: str | None) -> Settings:
    """Settings for a node cache described by plain values (a warm-up task's or a gateway's
    spec): the data directory and Redis URL come from the spec, the rest (`redis_cluster`
    included) from the environment and config file. A spec without a Redis URL has no Redis
    tier, so a `PREHEAT_REDIS_CLUSTER` set for other processes does not apply to it."""
    from cache_runtime.settings import Settings

    if redis_url is None:
        return Settings(data_dir=Path(data_dir), redis_url=None, redis_cluster=False)
    return Settings(data_dir=Path(data_dir), redis_url=redis_url)


def node_cache(
    settings: Settings,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ssd_bytes: int = DEFAULT_SSD_BYTES,
    redis_namespace: str = "preheat",
    session_idle_end_s: float | None = None,
) -> HybridCache:
    """The node's cache as this process sees it: memory (when `memory_bytes` > 0), the SSD tier
    under `<data_dir>/cache/ssd` (when `ssd_bytes` > 0) and, when `settings.redis_url` is set,
    the shared Redis tier (a Redis Cluster client when `settings.redis_cluster`). Every put
    writes through to all of them. The memory tier evicts by the pool `settings.policy`
    describes (`PoolPolicy.from_settings`). `session_idle_end_s`: a conversation not followed
    within it is ended (`TenantSessionPages`); None: only when the application says so.

    Write-through rather than routing each item to its planned tier: a warm-up run in its own
    process (a Prefect worker) cannot place anything in a serving process's memory, so what
    must outlive it goes to the tiers that do (SSD, Redis); the serving process promotes it
    into memory on first use. No Redis tier without a configured URL: a private Redis started
    for the run would vanish with it. With Redis, answers are validated by its generation
    counters, shared by every process (`cache_runtime/generations.py`); without, by this
    process's own, so answers another process stored on the SSD miss here.
    """
    from cache_runtime.heat import decay_params_path, tuned_half_life_s
    from cache_runtime.hybrid import HybridCache
    from cache_runtime.pool import PoolPolicy
    from cache_runtime.sessions import TenantSessionPages
    from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

    tiers: list[Any] = []
    ssd_dir = Path(settings.data_dir) / "cache" / "ssd"
    if memory_bytes > 0:
        tiers.append(MemoryTier(memory_bytes, policy=PoolPolicy.from_settings(settings.policy)))
    if ssd_bytes > 0:
        # The SSD tier ranks by decayed access frequency: with the half-life `tune-decay` chose.
        half_life = tuned_half_life_s(decay_params_path(settings.data_dir))
        tiers.append(SSDTier(ssd_dir, ssd_bytes, half_life))
    if settings.redis_url:
        client = redis_client(settings.redis_url, cluster=settings.redis_cluster)
        tiers.append(RedisTier(client, namespace=redis_namespace))
    if not tiers:
        raise ValueError("no cache tier: give memory or SSD bytes, or a Redis URL")
    return HybridCache(tiers, sessions=TenantSessionPages(idle_end_s=session_idle_end_s))

"""One serving node in the replay: its local tiers (memory, SSD), the shared Redis, a trace clock.

A restart replaces the memory tier and wipes the SSD tier (a re-imaged or new node starts with
empty local disks); the shared Redis tier survives. With `fast` (the default of `preheat
replay`) the SSD and Redis tiers are the in-memory simulations of `sim_tiers` and the memory
tier and hybrid cache are the real code; otherwise every tier is the real one — policies,
prefix closure, heat-aware SSD admission, Redis round trips. Both run on trace time through the
tiers' injectable clocks; only the values are stand-ins of `value_bytes` (hit ratios do not
depend on the bytes, and the latency model prices a block's real size).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from cache_runtime.hybrid import HybridCache
from cache_runtime.pool import PoolPolicy
from cache_runtime.settings import PolicySettings
from cache_runtime.tiers.memory import MemoryTier
from cache_runtime.tiers.ssd import SSDTier
from models.evaluation.replay.sim_tiers import SimRedisTier, SimSSDTier


class TraceClock:
    """The replay's clock: trace seconds, moved forward by the replay loop."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _NoMetrics:
    """The cache's Prometheus metrics, which no one scrapes in a replay: every metric, label and
    update is this no-op (counting them took a sixth of the fast replay's time)."""

    def __getattr__(self, name: str) -> _NoMetrics:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _NoMetrics:
        return self


class Node:
    """Tiers sized in blocks; `cache` is rebuilt by `restart`."""

    def __init__(
        self,
        memory_blocks: int,
        ssd_blocks: int,
        clock: TraceClock,
        redis_url: str | None = None,
        value_bytes: int = 64,
        workdir: Path | None = None,
        fast_redis_blocks: int | None = None,
        policy: PolicySettings | None = None,
    ) -> None:
        """`fast_redis_blocks`: None for the real tiers (and a Redis at `redis_url` when one is
        given); else the fast replay's tiers, with a simulated shared tier of that many blocks
        (0: none). `policy`: the memory tier's pool (None: the default), a new one for each
        incarnation, as a restarted node starts its own."""
        self.policy = policy or PolicySettings()
        self.memory_blocks, self.ssd_blocks = memory_blocks, ssd_blocks
        self.clock, self.redis_url, self.value_bytes = clock, redis_url, value_bytes
        self.fast = fast_redis_blocks is not None
        self._shared: Any = None
        if fast_redis_blocks:  # the shared tier outlives the node's restarts
            self._shared = SimRedisTier(fast_redis_blocks, clock=clock)
        self._own_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="preheat-replay-")) if workdir is None else workdir
        )
        self.incarnation = 0
        self.errors: dict[str, int] = {}  # tier errors over all incarnations: a degraded replay
        self.cache = self._build()

    @property
    def tier_names(self) -> list[str]:
        return [tier.name for tier in self.cache.tiers]

    def tier(self, name: str) -> Any:
        return next(t for t in self.cache.tiers if t.name == name)

    def holds_locally(self, key: str) -> bool:
        """In the memory or SSD tier (what a restart loses)."""
        return any(t.contains(key) for t in self.cache.tiers if t.name != "redis")

    def _build(self) -> HybridCache:
        tiers: list[Any] = []
        if self.memory_blocks > 0:
            pool = PoolPolicy.from_settings(self.policy)
            tiers.append(
                MemoryTier(self.memory_blocks * self.value_bytes, policy=pool, clock=self.clock)
            )
        if self.ssd_blocks > 0 and self.fast:
            tiers.append(SimSSDTier(self.ssd_blocks * self.value_bytes, clock=self.clock))
        elif self.ssd_blocks > 0:
            directory = self.workdir / f"ssd-{self.incarnation}"
            tiers.append(SSDTier(directory, self.ssd_blocks * self.value_bytes, clock=self.clock))
        if self._shared is not None:
            tiers.append(self._shared)
        elif self.redis_url is not None and not self.fast:
            import redis

            from cache_runtime.tiers.redis_tier import RedisTier

            client = redis.Redis.from_url(self.redis_url)
            tiers.append(RedisTier(client, namespace="replay", bulk_connections=1))
        if not tiers:
            raise ValueError("the node needs at least one tier: give --memory, --ssd or --redis")
        # A computed block is written to the fastest tier and to the shared one; the SSD fills
        # by demotion, as on a real node.
        write_through = [tiers[0].name] + (["redis"] if tiers[-1].name == "redis" else [])
        metrics: Any = _NoMetrics()
        return HybridCache(tiers, write_through=write_through, refill_workers=1, metrics=metrics)

    def _count_errors(self) -> None:
        for tier in self.cache.tiers:
            self.errors[tier.name] = self.errors.get(tier.name, 0) + tier.stats().errors

    def restart(self) -> None:
        """Lose the memory and SSD tiers (the shared Redis keeps its data)."""
        self._count_errors()
        self.cache.close()
        shutil.rmtree(self.workdir / f"ssd-{self.incarnation}", ignore_errors=True)
        self.incarnation += 1
        self.cache = self._build()

    def close(self) -> None:
        self._count_errors()
        self.cache.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

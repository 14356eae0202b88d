"""Cache tiers behind one protocol: memory (this process), SSD (local disk), Redis (shared)."""

from __future__ import annotations

from cache_runtime.tiers.base import Tier, TierStats
from cache_runtime.tiers.memory import MemoryTier
from cache_runtime.tiers.redis_connection import redis_client
from cache_runtime.tiers.redis_tier import RedisTier
from cache_runtime.tiers.ssd import SSDTier

__all__ = ["MemoryTier", "RedisTier", "SSDTier", "Tier", "TierStats", "redis_client"]

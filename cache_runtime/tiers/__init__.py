"""Cache tiers behind one protocol: memory (this process), SSD (local disk), Redis (shared)."""

from __future__ import annotations

from cache_runtime.tiers.base import Tier, TierStats
from cache_runtime.tiers.memory import MemoryTier

__all__ = ["MemoryTier", "Tier", "TierStats"]

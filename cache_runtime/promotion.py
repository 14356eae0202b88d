"""Promotion on hit: copying a value found below the top tier into the tiers above it.

There are two rules, on purpose kept apart and named for what they do:

- `into_every_tier_above` (after `HybridCache.get` / `lookup`): the value goes into every tier
  above the one that served it.
- `chain_into_top_tier` (after `HybridCache.get_chain`): the pages of a KV prefix chain go into
  the top tier only, in chain order; the tiers between receive them by demotion when the top
  evicts them. `get_chain`'s docstring says why (a restore wrote every page to the SSD on its
  path, and lost its latency to it).

Both renew a renew-on-hit TTL first (`renew_on_hit`), and both give a copy the expiry its
source had; a copy whose expiry could not be read, or has passed, is not made (`copyable`).
Copies are unchecked: an answer carries its generations' stamp, so a stale copy can never be
served from the tier it goes to.
"""

from __future__ import annotations

from typing import Any

from cache_runtime.metrics import CacheMetrics
from cache_runtime.tier_health import UNKNOWN, TierCalls
from cache_runtime.tiers.base import Tier
from cache_runtime.ttl_renewals import RenewOnHitTtls


def copyable(ttl: Any) -> bool:
    """Whether a value with `ttl` seconds left may be copied up: an unknown expiry must not
    become "never", and an expired value is not copied."""
    return ttl is not UNKNOWN and (ttl is None or ttl > 0)


class Promotions:
    """The promotions of one cache: its `tiers` (fastest first, the cache's own list), the
    guarded `call` into them, the `metrics` that count promotions, and its `renewals`."""

    def __init__(
        self,
        tiers: list[Tier],
        call: TierCalls,
        metrics: CacheMetrics,
        renewals: RenewOnHitTtls,
    ) -> None:
        self._tiers = tiers
        self._call = call
        self._metrics = metrics
        self._renewals = renewals

    def renew_on_hit(self, key: str, depth: int) -> float | None:
        """Renew `key`'s renew-on-hit TTL in the tier at `depth` that served it; the TTL, or
        None where it has none to renew."""
        renew = self._renewals.ttl(key)
        if renew is not None:
            tier = self._tiers[depth]
            self._call(tier, "touch", tier.touch, key, renew)
        return renew

    def into_every_tier_above(self, key: str, raw: bytes, depth: int, parent: str | None) -> None:
        """After a hit at `depth`: renew a renew-on-hit TTL; promote a copy found below the
        top into every tier above it (unchecked: it carries its stamp, so a stale one can
        never be served from the tier it goes to)."""
        tier = self._tiers[depth]
        renew = self.renew_on_hit(key, depth)
        if not depth:
            return
        ttl = renew if renew is not None else self._call(
            tier, "ttl", tier.ttl_left, key, on_error=UNKNOWN
        )  # fmt: skip
        if not copyable(ttl):
            return
        for upper in self._tiers[:depth]:
            if self._call(upper, "put", upper.put, key, raw, ttl_s=ttl, parent=parent):
                self._metrics.promotions.labels(upper.name).inc()

    def chain_into_top_tier(
        self, keys: list[str], chain: list[tuple[bytes, int]], parents: list[str | None]
    ) -> None:
        """After a chain read (`chain` holds each page's value and depth): renew renew-on-hit
        TTLs; copy the pages found below the top into the top tier, in order, stopping at the
        first that cannot go (a later one would have no parent there)."""
        top, ttls = self._tiers[0], self._chain_ttls(keys, chain)
        for key, (value, depth), parent, ttl in zip(keys, chain, parents, ttls, strict=True):
            renew = self.renew_on_hit(key, depth)
            ttl = renew if renew is not None else ttl
            if not depth:
                continue
            if not copyable(ttl):
                break
            if not self._call(top, "put", top.put, key, value, ttl_s=ttl, parent=parent):
                break
            self._metrics.promotions.labels(top.name).inc()

    def _chain_ttls(self, keys: list[str], chain: list[tuple[bytes, int]]) -> list[Any]:
        """Seconds left of each page found below the top (`UNKNOWN` where its tier failed),
        with one call per tier where the tier has `ttl_left_many`; None for the top's own."""
        ttls: list[Any] = [None] * len(keys)
        for depth in sorted({depth for _, depth in chain} - {0}):
            tier, where = self._tiers[depth], [i for i, hit in enumerate(chain) if hit[1] == depth]
            many = getattr(tier, "ttl_left_many", None)
            if callable(many):
                found = self._call(tier, "ttl", many, [keys[i] for i in where])
                left = [UNKNOWN] * len(where) if found is None else found
            else:
                left = [
                    self._call(tier, "ttl", tier.ttl_left, keys[i], on_error=UNKNOWN) for i in where
                ]
            for i, seconds in zip(where, left, strict=True):
                ttls[i] = seconds
        return ttls

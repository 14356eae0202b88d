"""The one protocol every cache tier implements, and the counters every tier keeps.

Tiers store opaque bytes under key strings (`CacheKey.to_string()`). A tier whose backend fails
(Redis down, disk error) does not raise from `get`/`put`/`delete`/`contains`: it answers as a miss
or a refusal and counts the error, because a cache tier must never fail a request (the hybrid
cache degrades to the tiers still working).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# on_evict(key, value, seconds of TTL left or None, monotonic_ns of the write or None if unknown)
EvictionCallback = Callable[[str, bytes, float | None, int | None], None]


@dataclass
class TierStats:
    """Counters since the tier was opened (items/bytes: current contents)."""

    items: int = 0
    bytes: int = 0
    capacity_bytes: int | None = None
    hits: int = 0
    misses: int = 0
    puts: int = 0
    rejected: int = 0
    evictions: int = 0
    expirations: int = 0
    errors: int = 0


@runtime_checkable
class Tier(Protocol):
    """get / put / delete / contains / stats / check / close, and touch (reset an entry's TTL,
    for renew-on-hit expiry) and ttl_left (seconds left, None for no expiry, 0.0 when absent:
    a value promoted to a faster tier keeps its expiry).

    `put` returns False when the value was not stored (too large for the budget, refused by
    admission, backend failure). `ttl_s` is a lifetime in seconds (None: until evicted);
    `pinned` entries are never evicted (they still expire and can be deleted); `parent` names
    the previous page of a KV prefix chain, for tiers that keep chains prefix-closed; `hint`
    is application knowledge for the eviction policy (`policies.Hint`), ignored by tiers
    without one.
    `check` returns a list of problems found (empty when consistent). Tiers that evict on their
    own accept an `on_evict(key, value, ttl_left_s, written_ns)` callback, which the hybrid
    cache uses to demote an evicted entry to the next tier down.
    Optional: `shared = True` on a tier every process sees (Redis), `generations()` on a
    tier that can hold answers' generation counters for every process (`RedisTier`), and
    `get_many(keys) -> list[bytes | None]` on a tier where one call for many keys costs less
    than one per key (a Redis MGET, one SQLite transaction): a KV prefix chain is read with it.
    """

    name: str

    def get(self, key: str) -> bytes | None: ...

    def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl_s: float | None = None,
        pinned: bool = False,
        parent: str | None = None,
        hint: str | None = None,
    ) -> bool:
        """True if stored. False (refused, or the backend failed) must leave no older value of
        `key` served by this tier: the caller holds a newer one, stored elsewhere."""
        ...

    def delete(self, key: str) -> bool: ...

    def touch(self, key: str, ttl_s: float | None) -> bool: ...

    def ttl_left(self, key: str) -> float | None: ...

    def contains(self, key: str) -> bool: ...

    def stats(self) -> TierStats: ...

    def check(self) -> list[str]: ...

    def close(self) -> None: ...

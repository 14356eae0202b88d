"""Renew-on-hit TTLs: which keys have one, and how long, for `HybridCache`.

A key written with `ttl_mode="renew"` keeps its TTL here; every hit resets the expiry of the
copy that served it (`Promotions.renew_on_hit`), and a copy promoted after a hit gets the full
TTL rather than what was left of it. The tiers only store expiries, so the TTL to renew to has
to be remembered by the cache. Forgotten when the key is deleted, rewritten without the mode,
or found in no tier, so the table holds at most the keys still cached.
"""

from __future__ import annotations

import threading
from typing import Literal

TtlMode = Literal["fixed", "renew"]


class RenewOnHitTtls:
    """Key -> its renew-on-hit TTL in seconds; safe to use from the lookup threads and the
    background refills at once."""

    def __init__(self) -> None:
        self._ttls: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, key: str, ttl_s: float | None, mode: TtlMode) -> None:
        """A write of `key`: it renews on hit from now on if written so with a TTL, else not."""
        with self._lock:
            if mode == "renew" and ttl_s is not None:
                self._ttls[key] = ttl_s
            else:
                self._ttls.pop(key, None)

    def forget(self, key: str) -> None:
        """`key` is gone (deleted, or found in no tier): its TTL goes too."""
        with self._lock:
            self._ttls.pop(key, None)

    def ttl(self, key: str) -> float | None:
        """The TTL `key` renews to on a hit; None where it has none."""
        with self._lock:
            return self._ttls.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ttls)

"""Each tenant's recent share of the model: its model time, decayed with a half-life.

The decoder (`batch_decoder.py`) serves, among requests that have decoded as many tokens, the
tenant that has used the model least first: a tenant that sends requests now and then finds the
model almost as if it were alone, while a tenant that keeps it busy has a large usage and waits.
Decay makes the order fair over time: two tenants that both keep the model busy come to equal
usage, and then take turns.

Rather than turns in rotation between tenants: that gives every tenant with work an equal share
of each moment, so a short request cost twice its idle time next to a flood (measured with
`benchmarks/gateway_abuse.py`: 3.8x at p95).
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_HALF_LIFE_S = 10.0
_FORGOTTEN = 1e-9  # usage (seconds) below which a tenant is dropped: the table stays small


class TenantUsage:
    """Decayed model seconds per tenant; a tenant never seen has used nothing."""

    def __init__(
        self, half_life_s: float = DEFAULT_HALF_LIFE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.half_life_s = half_life_s
        self._clock = clock
        self._used: dict[str, tuple[float, float]] = {}  # tenant -> (seconds, as of when)
        self._prune_at = 64  # table size that triggers the next pruning

    def of(self, tenant: str) -> float:
        """`tenant`'s usage now, in decayed seconds."""
        seconds, when = self._used.get(tenant, (0.0, 0.0))
        return seconds * 0.5 ** ((self._clock() - when) / self.half_life_s) if seconds else 0.0

    def add(self, tenant: str, seconds: float) -> None:
        now = self._clock()
        self._used[tenant] = (self.of(tenant) + seconds, now)
        if len(self._used) > self._prune_at:  # drop the tenants whose usage decayed to nothing
            self._used = {t: u for t, u in self._used.items() if self.of(t) > _FORGOTTEN}
            # next time at twice what is left: with many tenants alive, pruning stays amortised
            # O(1) per call (the decoder calls this for every row of every step)
            self._prune_at = max(64, 2 * len(self._used))

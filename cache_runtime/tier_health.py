"""Guarded tier calls and the failures they leave behind, for `HybridCache`.

A tier must never fail a request: every call the cache makes into one goes through `TierCalls`,
which turns an exception into a miss or a refused write, counts it per tier and operation, times
the call, and remembers each tier's last failure. `HybridCache.health()` reports the tiers that
failed a call in the last `RECENT_ERROR_S` seconds, measured on the clock the cache was given
(injectable, so that a test moves time instead of sleeping through it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cache_runtime.metrics import CacheMetrics
from cache_runtime.tiers.base import Tier

UNKNOWN = object()  # what a tier call that raised returns where None means something
RECENT_ERROR_S = 10.0  # a tier that failed a call this recently is reported degraded


class TierCalls:
    """Calls into tiers, each guarded (`__call__`), and the last failure of each tier, stamped
    with `clock` (`recent_failures`)."""

    def __init__(self, metrics: CacheMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._clock = clock
        self._last_errors: dict[str, tuple[float, str]] = {}  # tier -> (clock, what failed)

    def __call__(
        self,
        tier: Tier,
        op: str,
        action: Callable[..., Any],
        *args: Any,
        on_error: Any = None,
        **kwargs: Any,
    ) -> Any:
        """`action(*args, **kwargs)`, or `on_error` if it raised (a miss, a refused write).

        The latency histogram is timed with `time.perf_counter`, not `clock`: it measures how
        long the call really took, which a test's fake clock would record as zero."""
        started = time.perf_counter()
        try:
            return action(*args, **kwargs)
        except Exception as error:  # a tier must never fail the request: count, carry on
            self._metrics.errors.labels(tier.name, op).inc()
            self._last_errors[tier.name] = (self._clock(), f"{op} ({type(error).__name__})")
            return on_error
        finally:
            self._metrics.latency.labels(tier.name, op).observe(time.perf_counter() - started)

    def recent_failures(self) -> dict[str, str]:
        """Tier name -> what failed and how long ago, for each tier whose last failure is at
        most `RECENT_ERROR_S` seconds old."""
        problems: dict[str, str] = {}
        now = self._clock()
        for name, (when, what) in list(self._last_errors.items()):
            if now - when <= RECENT_ERROR_S:
                problems[name] = f"{what} failed {now - when:.1f}s ago; served by the other tiers"
        return problems

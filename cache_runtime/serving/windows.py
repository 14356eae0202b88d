"""Time windows the gateway's derived metrics are computed over, each with an injectable clock
(tests move time instead of sleeping).

- `SlidingCounts`: sums per label over the last `window_s` (hit ratios, shares, rates).
- `RecentLatencies`: the latencies of the last `window_s` per route (SLA share, p95).
- `DecayedSum`: an exponentially decayed sum with a half-life (ROI's value and cost).

Rejected: deriving windows from the Prometheus counters' history at scrape time. The values
would then depend on how often `/metrics` is scraped, and a gateway nobody scrapes for a while
would report its first window over all of that time.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable

Clock = Callable[[], float]


class SlidingCounts:
    """Sums per key over the last `window_s`, kept in `slots` buckets: an amount leaves the
    window between `window_s` and `window_s + window_s / slots` after it was added."""

    def __init__(self, window_s: float, clock: Clock = time.monotonic, slots: int = 60) -> None:
        if not (window_s > 0 and slots >= 1):
            raise ValueError("window_s must be > 0 and slots >= 1")
        self.window_s, self._clock, self._slots = window_s, clock, slots
        self._width = window_s / slots
        self._buckets: deque[tuple[int, Counter[Hashable]]] = deque()
        self._lock = threading.Lock()

    def add(self, key: Hashable, amount: float = 1.0) -> None:
        index = int(self._clock() // self._width)
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != index:
                self._buckets.append((index, Counter()))
                self._drop_old(index)
            self._buckets[-1][1][key] += amount

    def totals(self) -> dict[Hashable, float]:
        """Every key's sum within the window."""
        index = int(self._clock() // self._width)
        out: Counter[Hashable] = Counter()
        with self._lock:
            self._drop_old(index)
            for _, bucket in self._buckets:
                out.update(bucket)
        return dict(out)

    def total(self, key: Hashable) -> float:
        return self.totals().get(key, 0.0)

    def _drop_old(self, index: int) -> None:
        while self._buckets and self._buckets[0][0] <= index - self._slots:
            self._buckets.popleft()


class RecentLatencies:
    """Latencies of the last `window_s` per route, at most `limit` per route (the newest)."""

    def __init__(self, window_s: float, clock: Clock = time.monotonic, limit: int = 50_000) -> None:
        self.window_s, self._clock, self._limit = window_s, clock, limit
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def add(self, route: str, seconds: float) -> None:
        with self._lock:
            samples = self._samples.get(route)
            if samples is None:
                samples = self._samples[route] = deque(maxlen=self._limit)
            samples.append((self._clock(), seconds))

    def recent(self) -> dict[str, list[float]]:
        """Per route, the latencies observed within the window."""
        horizon = self._clock() - self.window_s
        with self._lock:
            for samples in self._samples.values():
                while samples and samples[0][0] < horizon:
                    samples.popleft()
            return {route: [s for _, s in samples] for route, samples in self._samples.items()}


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (NaN for no values): a latency that was really observed."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class DecayedSum:
    """sum_i amount_i x 2^(-(now - t_i) / half_life_s), updated in O(1) per `add`.

    Times are wall-clock seconds (the warm-up ledger records them so); an amount dated in the
    future of the last one moves the reference forward, one dated in its past is decayed to it.
    """

    def __init__(self, half_life_s: float, clock: Clock = time.time) -> None:
        if not half_life_s > 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life_s, self._clock = half_life_s, clock
        self._value, self._at = 0.0, clock()
        self._lock = threading.Lock()

    def _factor(self, age_s: float) -> float:
        return 2.0 ** (-age_s / self.half_life_s)

    def add(self, amount: float, at: float | None = None) -> None:
        at = self._clock() if at is None else at
        with self._lock:
            if at >= self._at:
                self._value = self._value * self._factor(at - self._at) + amount
                self._at = at
            else:
                self._value += amount * self._factor(self._at - at)

    def value(self, at: float | None = None) -> float:
        at = self._clock() if at is None else at
        with self._lock:
            return self._value * self._factor(max(0.0, at - self._at))

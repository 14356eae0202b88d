"""Forecast error over the last window: the demand the node planned with against the requests
this gateway saw.

**The forecast** is the champion forecaster's `KeyForecast` on the lake's demand features — what
`models.warmup.prepare.load_forecast` gives the warm-up planner — reloaded periodically. Only
predictions for buckets that have not started yet are taken: a bucket's prediction is the one
made before its traffic could be seen.

**The actuals** are counted per (tenant, demand key, bucket) by the same key rule as the
features (`models.features.demand.demand_keys`): `template:<id>` when the request has a template,
else `prefix:<first 16-token block hash>`, else `route:<route>`; every request also counts for
its tenant's `__total__`, and `__other__` (a tenant's demand outside the forecast's top keys) is
its total minus the counts of its forecast keys.

**MAPE** = 100 x mean(|actual - predicted| / actual) over the (tenant, key, bucket) points whose
bucket ended within the last `window_s`, began after counting started (so it was seen whole) and
had actual > 0 (MAPE is undefined at 0; `points` says how many terms there were). NaN with no
point.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

import pandas as pd

from cache_runtime.prefix_hash import PAGE_TOKENS, chain_block_hashes
from cache_runtime.serving.windows import Clock

TOTAL, OTHER = "__total__", "__other__"
_EPOCH = pd.Timestamp(0, tz="UTC")


def first_block_hash(ids: list[int] | None) -> int | None:
    """The first of the request log's `prefix_hashes` for a prompt's tokens (what the gateway
    logs, `runners.prefix_hashes`); None without a full block."""
    if not ids or len(ids) < PAGE_TOKENS:
        return None
    return chain_block_hashes([ids[:PAGE_TOKENS]])[0]


def demand_key(template: str | None, first_hash: int | None, route: str) -> str:
    """The demand series a request belongs to (the features' rule, module docstring)."""
    if template is not None:
        return f"template:{template}"
    if first_hash is not None:
        return f"prefix:{first_hash}"
    return f"route:{route}"


class ForecastError:
    """Predicted vs seen demand per (tenant, key, bucket), and the MAPE of the last window."""

    def __init__(self, window_s: float, clock: Clock = time.time) -> None:
        self.window_s, self._clock = window_s, clock
        self.started = clock()
        self.granularity: str | None = None
        self._width: float | None = None
        self._predicted: dict[tuple[str, str, float], float] = {}
        self._actual: Counter[tuple[str, str, float]] = Counter()
        self._lock = threading.Lock()

    def set_forecast(self, forecast: pd.DataFrame, width_s: float) -> int:
        """Take a `KeyForecast`'s predictions for buckets not started yet; returns how many."""
        now = self._clock()
        starts = (pd.to_datetime(forecast["bucket_start"], utc=True) - _EPOCH).dt.total_seconds()
        taken = 0
        with self._lock:
            if self._width is not None and self._width != width_s:
                self._predicted.clear()  # another granularity: buckets no longer line up
                self._actual.clear()
                self.started = now
            self._width = width_s
            self.granularity = str(forecast["granularity"].iloc[0]) if len(forecast) else None
            rows = zip(forecast["tenant"], forecast["key"], starts.to_numpy(),
                       forecast["predicted"], strict=True)  # fmt: skip
            for tenant, key, start, predicted in rows:
                if start >= now:
                    self._predicted[(str(tenant), str(key), float(start))] = float(predicted)
                    taken += 1
        return taken

    def observe(self, tenant: str, key: str | None) -> None:
        """Count one request (only while a forecast is loaded: otherwise nothing to compare)."""
        width = self._width
        if width is None:
            return
        now = self._clock()
        start = now - now % width
        with self._lock:
            self._actual[(tenant, TOTAL, start)] += 1
            if key is not None:
                self._actual[(tenant, key, start)] += 1

    def mape(self) -> tuple[float, int]:
        """(MAPE in percent, points averaged); NaN and 0 when there is no point."""
        width = self._width
        if width is None:
            return math.nan, 0
        now = self._clock()
        with self._lock:
            self._forget(now - self.window_s - width)
            done = {
                k: p for k, p in self._predicted.items()
                if k[2] >= self.started and now - self.window_s <= k[2] + width <= now
            }  # fmt: skip
            actual = dict(self._actual)
        errors = []
        for (tenant, key, start), predicted in done.items():
            seen = self._seen(actual, done, tenant, key, start)
            if seen > 0:
                errors.append(abs(seen - predicted) / seen)
        if not errors:
            return math.nan, 0
        return 100.0 * sum(errors) / len(errors), len(errors)

    @staticmethod
    def _seen(
        actual: dict[tuple[str, str, float], float],
        predicted: dict[tuple[str, str, float], float],
        tenant: str,
        key: str,
        start: float,
    ) -> float:
        if key != OTHER:
            return actual.get((tenant, key, start), 0.0)
        named = sum(
            actual.get((t, k, s), 0.0)
            for t, k, s in predicted
            if t == tenant and s == start and k not in (TOTAL, OTHER)
        )
        return actual.get((tenant, TOTAL, start), 0.0) - named

    def _forget(self, before: float) -> None:
        for store in (self._predicted, self._actual):
            for k in [k for k in store if k[2] < before]:
                del store[k]

"""What a warmed hit saved, and warm-up's return on investment.

**Saved latency.** A hit on an entry warm-up wrote saves the model work the request would
otherwise have cost, priced from the model calls this gateway timed (never a constant):

- an exact response: `a x prompt_tokens + b x completion_tokens`, where `ModelCost` fits
  model seconds ~ a x (uncached prompt tokens) + b x (completion tokens) by exponentially
  forgetting least squares over the model calls (a ratio of seconds to tokens until two
  independent calls make the fit determined, or when it would come out negative);
- a reused KV prefix: `a x cached_tokens` (the prefill it skipped);
- an embedding: the measured MiniLM seconds per input that missed (`RateEstimate`).

The gateway's own overhead is paid by a hit and a miss alike, so it is not part of the saving.
Hits seen before any model call is timed wait (bounded) until the first one prices them.

**ROI** = (value of latency saved by warmed hits - warm-up cost) / warm-up cost, with
value = `value_per_saved_s` x saved seconds and cost = `cost_per_compute_s` x the compute
seconds the warm-up ledgers recorded, each contribution decayed by 2^(-age / half_life_s).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from cache_runtime.serving.windows import Clock, DecayedSum

_PENDING_LIMIT = 10_000


class ModelCost:
    """seconds ~ a x uncached prompt tokens + b x completion tokens (module docstring)."""

    def __init__(self, forget: float = 0.995) -> None:
        self.forget = forget  # weight left to past calls after each new one
        self._xx = np.zeros((2, 2))
        self._xy = np.zeros(2)
        self._seconds = self._tokens = 0.0
        self._lock = threading.Lock()

    def observe(self, new_prompt_tokens: int, completion_tokens: int, seconds: float) -> None:
        x = np.array([float(new_prompt_tokens), float(completion_tokens)])
        if seconds < 0 or not x.sum() > 0:
            return
        with self._lock:
            f = self.forget
            self._xx = f * self._xx + np.outer(x, x)
            self._xy = f * self._xy + x * seconds
            self._seconds = f * self._seconds + seconds
            self._tokens = f * self._tokens + float(x.sum())

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) in seconds per token; None before the first call."""
        with self._lock:
            if not self._tokens > 0:
                return None
            xx, xy, rate = self._xx.copy(), self._xy.copy(), self._seconds / self._tokens
        if np.linalg.cond(xx) < 1e8:
            a, b = np.linalg.solve(xx, xy)
            if a >= 0 and b >= 0:
                return float(a), float(b)
        return rate, rate

    def seconds(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        fitted = self.coefficients()
        if fitted is None:
            return None
        return fitted[0] * prompt_tokens + fitted[1] * completion_tokens


class RateEstimate:
    """Decayed seconds per unit (MiniLM seconds per embedded input)."""

    def __init__(self, forget: float = 0.995) -> None:
        self.forget, self._seconds, self._units = forget, 0.0, 0.0
        self._lock = threading.Lock()

    def observe(self, units: int, seconds: float) -> None:
        if units > 0 and seconds >= 0:
            with self._lock:
                self._seconds = self.forget * self._seconds + seconds
                self._units = self.forget * self._units + units

    def per_unit(self) -> float | None:
        with self._lock:
            return self._seconds / self._units if self._units > 0 else None


class Roi:
    """Decayed value and cost of warm-up, and their ROI (module docstring)."""

    def __init__(
        self,
        value_per_saved_s: float = 1.0,
        cost_per_compute_s: float = 1.0,
        half_life_s: float = 86_400.0,
        clock: Clock = time.time,
    ) -> None:
        self.value_per_saved_s, self.cost_per_compute_s = value_per_saved_s, cost_per_compute_s
        self.saved_s = DecayedSum(half_life_s, clock)
        self.compute_s = DecayedSum(half_life_s, clock)

    def value(self) -> float:
        return self.value_per_saved_s * self.saved_s.value()

    def cost(self) -> float:
        return self.cost_per_compute_s * self.compute_s.value()

    def roi(self) -> float:
        """NaN while warm-up has cost nothing (no ledger read yet): the ratio is undefined."""
        cost = self.cost()
        return (self.value() - cost) / cost if cost > 0 else math.nan


@dataclass(frozen=True)
class WarmedHit:
    kind: str  # exact, prefix or embedding
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    at: float


class Savings:
    """Prices warmed hits (module docstring) into `roi.saved_s`."""

    def __init__(self, roi: Roi, clock: Clock = time.time) -> None:
        self.roi, self._clock = roi, clock
        self.model, self.embedding = ModelCost(), RateEstimate()
        self._pending: deque[WarmedHit] = deque(maxlen=_PENDING_LIMIT)
        self._lock = threading.Lock()

    def model_call(
        self, prompt_tokens: int, cached_tokens: int, completion_tokens: int, seconds: float
    ) -> None:
        self.model.observe(max(0, prompt_tokens - cached_tokens), completion_tokens, seconds)
        self._price_pending()

    def embedding_call(self, inputs: int, seconds: float) -> None:
        self.embedding.observe(inputs, seconds)
        self._price_pending()

    def warmed_hit(
        self, kind: str, prompt_tokens: int = 0, completion_tokens: int = 0, cached_tokens: int = 0
    ) -> float | None:
        """Book one warmed hit; returns the seconds it saved (None: not priced yet)."""
        hit = WarmedHit(kind, prompt_tokens, completion_tokens, cached_tokens, self._clock())
        saved = self.price(hit)
        if saved is None:
            with self._lock:
                self._pending.append(hit)
            return None
        self.roi.saved_s.add(saved, hit.at)
        return saved

    def price(self, hit: WarmedHit) -> float | None:
        if hit.kind == "embedding":
            return self.embedding.per_unit()
        fitted = self.model.coefficients()
        if fitted is None:
            return None
        if hit.kind == "prefix":
            return fitted[0] * hit.cached_tokens
        return fitted[0] * hit.prompt_tokens + fitted[1] * hit.completion_tokens

    def _price_pending(self) -> None:
        with self._lock:
            if not self._pending:
                return
            waiting, self._pending = list(self._pending), deque(maxlen=_PENDING_LIMIT)
        for hit in waiting:
            saved = self.price(hit)
            if saved is None:
                with self._lock:
                    self._pending.append(hit)
            else:
                self.roi.saved_s.add(saved, hit.at)

"""Heat: how the platform ranks what to keep and what to warm.

Two scores live here:

- `coupled_heat`: heat = sim x exp(-lambda x age) x priority / 10 — an item's relevance to its
  template (sim in [0, 1]), decayed by its age, weighted by its SLA priority (1..10). Vectorised
  over numpy arrays, with an injectable clock. The default decay is the classic "lambda = 0.5 per
  day" (half-life ln 2 / 0.5 days = 1.386 days); `DecayParams` states it as a half-life in
  seconds, which is what the tuner (issue 5) searches over.
- the decayed access frequency below, which the SSD tier ranks entries by.

Decayed access frequency ("sliding-window frequency x time decay") as one sortable number:

A key's heat is its accesses, each weighted by exp(-lambda x age): h(now) = sum exp(-l (now - t_i)).
Kept incrementally as (h, t_last): on access, h <- h x exp(-l (now - t_last)) + 1. Comparing two
keys' heat *now* is comparing log h + l x t_last, which does not change as time passes — so the
score can sit in a database index and "the coldest entry" is an ORDER BY, not a scan.
The exponential decay is the sliding window: an access one half-life ago counts half.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_HALF_LIFE_S = 3600.0  # the SSD tier's access-frequency half-life
DAY_S = 86_400.0
CLASSIC_LAMBDA_PER_DAY = 0.5


@dataclass(frozen=True)
class DecayParams:
    """The coupled decay's parameters. `half_life_s` is the age at which heat halves;
    `priority_weight` w weighs a request of priority p by (p / 10) ** w (`HeatPolicy`): 0 ignores
    priority, 1 (the default) is the classic formula's linear priority / 10."""

    half_life_s: float = math.log(2) / CLASSIC_LAMBDA_PER_DAY * DAY_S
    priority_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.half_life_s > 0 or not math.isfinite(self.half_life_s):
            raise ValueError("half_life_s must be a positive finite number of seconds")
        if not self.priority_weight >= 0 or not math.isfinite(self.priority_weight):
            raise ValueError("priority_weight must be a finite number >= 0")

    @property
    def lambda_per_s(self) -> float:
        return math.log(2) / self.half_life_s

    @classmethod
    def from_lambda_per_day(cls, lam: float) -> DecayParams:
        if not lam > 0:
            raise ValueError("lambda must be positive")
        return cls(half_life_s=math.log(2) / lam * DAY_S)

    def save(self, path: Path, **provenance: object) -> None:
        """Write atomically (the cache runtime may be reading): tmp file, then rename."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        params = {"half_life_s": self.half_life_s, "priority_weight": self.priority_weight}
        tmp.write_text(json.dumps({**params, **provenance}, default=str))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> DecayParams:
        """The tuned parameters (`tune-decay` flow), or the default when none were written yet.
        A corrupt file raises: silently falling back would hide a broken tuner. A file written
        before the priority weight was tuned has none: it gets the default (1.0)."""
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text())
        return cls(
            half_life_s=float(data["half_life_s"]),
            priority_weight=float(data.get("priority_weight", cls.priority_weight)),
        )


def decay_params_path(data_dir: str | Path) -> Path:
    """Where `tune-decay` publishes the decay and the cache runtime reads it."""
    return Path(data_dir) / "tuning" / "decay.json"


def tuned_half_life_s(path: Path, default: float = DEFAULT_HALF_LIFE_S) -> float:
    """The half-life the `tune-decay` flow published at `path`, else `default`.

    For the tiers that rank by decayed access frequency (the SSD tier): until a tuning has run
    they keep their own default (an hour), not the coupled decay's 1.4 days, which on prefix
    pages behaves like LFU.
    """
    return DecayParams.load(path).half_life_s if path.is_file() else default


def coupled_heat(
    sim: np.ndarray | float,
    last_seen_s: np.ndarray | float,
    priority: np.ndarray | int,
    params: DecayParams = DecayParams(),
    clock: Callable[[], float] = time.time,
) -> np.ndarray:
    """heat = sim x exp(-lambda x age) x (priority / 10) ** w, element-wise, in [0, 1].

    w is `params.priority_weight`: 1 (the default) is the classic formula, priority / 10.

    Args:
        sim: similarity of each item to its template, in [0, 1].
        last_seen_s: when each item was last requested (epoch seconds); age = now - last_seen,
            and a time in the future (clock skew between nodes) counts as age 0, not as heat > 1.
        priority: 1..10.
        params: the decay.
        clock: now, in epoch seconds (injectable: tests never sleep).

    Raises:
        ValueError: sim outside [0, 1], priority outside 1..10, or a non-finite time.
    """
    sim = np.asarray(sim, dtype="float64")
    priority = np.asarray(priority)
    last_seen = np.asarray(last_seen_s, dtype="float64")
    if np.any(~np.isfinite(sim)) or np.any((sim < 0) | (sim > 1)):
        raise ValueError("sim must be in [0, 1]")
    if np.any((priority < 1) | (priority > 10)) or np.any(priority != np.round(priority)):
        raise ValueError("priority must be an integer in 1..10")
    if np.any(~np.isfinite(last_seen)):
        raise ValueError("last_seen_s must be finite")
    age = np.maximum(clock() - last_seen, 0.0)
    return sim * np.exp(-params.lambda_per_s * age) * (priority / 10.0) ** params.priority_weight


def decay_rate(half_life_s: float) -> float:
    if half_life_s <= 0:
        raise ValueError("half_life_s must be positive")
    return math.log(2) / half_life_s


def bump(heat: float, last_s: float, now_s: float, rate: float) -> float:
    """Heat after one more access at `now_s`, given the heat at `last_s`."""
    return heat * math.exp(-rate * max(0.0, now_s - last_s)) + 1.0


def score(heat: float, last_s: float, rate: float) -> float:
    """Time-invariant rank of a key's current heat: larger is hotter."""
    return math.log(max(heat, 1e-300)) + rate * last_s


def heat_at(heat: float, last_s: float, now_s: float, rate: float) -> float:
    return heat * math.exp(-rate * max(0.0, now_s - last_s))

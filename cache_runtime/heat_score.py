"""Decayed access frequency ("sliding-window frequency x time decay") as one sortable number.

A key's heat is its accesses, each weighted by exp(-lambda x age): h(now) = sum exp(-l (now - t_i)).
Kept incrementally as (h, t_last): on access, h <- h x exp(-l (now - t_last)) + 1. Comparing two
keys' heat *now* is comparing log h + l x t_last, which does not change as time passes — so the
score can sit in a database index and "the coldest entry" is an ORDER BY, not a scan.
The exponential decay is the sliding window: an access one half-life ago counts half.
"""

from __future__ import annotations

import math

DEFAULT_HALF_LIFE_S = 3600.0


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

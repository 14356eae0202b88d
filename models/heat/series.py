"""Per-key heat series: what the heat-evolution GAN learns from and simulates.

A key's heat in a bucket is its decayed request count — the platform's heat (decayed access
frequency, `cache_runtime.heat`) sampled once per bucket:

    heat[t] = count[t] + heat[t-1] x 2^(-1 / half_life_buckets)      (half_life 0: raw counts)

and each (history, continuation) window is normalised by `window_scale` of its history, the
same for real and generated continuations. `HeatWindows` cuts windows out of a (K, N) matrix
of heat, and `HeatSplit` splits them in time so that no training window overlaps the
held-back part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def window_scale(history: np.ndarray) -> np.ndarray:
    """(B, L) heat in requests -> (B,) the scale a window is normalised by: 1 + its mean.

    DeepAR's choice (Salinas et al. 2020): the model sees every key on one scale whatever its
    volume, a level that moves over time does not leave the range it learned (per-key scales
    fitted on old data did, on the non-stationary Mooncake trace), and the "1 +" is one
    request, so a quiet key's window is not blown up by dividing by ~0.
    """
    return 1.0 + np.asarray(history, dtype=np.float64).mean(axis=1)


def decayed_heat(counts: np.ndarray, half_life_buckets: float) -> np.ndarray:
    """(K, N) counts -> (K, N) heat decayed by `half_life_buckets` (0: the counts unchanged)."""
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    if half_life_buckets < 0 or not np.isfinite(half_life_buckets):
        raise ValueError("half_life_buckets must be a finite number >= 0")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError("counts must be finite and >= 0")
    if half_life_buckets == 0:
        return counts.copy()
    keep = 2.0 ** (-1.0 / half_life_buckets)
    heat = np.empty_like(counts)
    running = np.zeros(counts.shape[0])
    for t in range(counts.shape[1]):  # N is hundreds to a few thousand buckets: a loop is fine
        running = running * keep + counts[:, t]
        heat[:, t] = running
    return heat


@dataclass(frozen=True)
class HeatWindows:
    """(history, continuation) pairs: history (B, L) and continuation (B, T) of normalised heat."""

    history: np.ndarray  # (B, L) float32
    continuation: np.ndarray  # (B, T) float32
    rows: np.ndarray  # (B,) which key each window is from
    origins: np.ndarray  # (B,) index of each continuation's first bucket

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def cut(
        cls, heat: np.ndarray, history: int, horizon: int, first: int = 0, last: int | None = None
    ) -> HeatWindows:
        """Every window whose continuation starts in [first, last] and fits in the series.

        Args:
            heat: (K, N) normalised heat.
            history: L buckets of history; horizon: T buckets of continuation.
            first / last: bounds (inclusive) of the continuation's first bucket.
        """
        if history < 1 or horizon < 1:
            raise ValueError("history and horizon must be at least 1 bucket")
        n = heat.shape[1]
        stop = n - horizon if last is None else min(last, n - horizon)
        origins = np.arange(max(first, history), stop + 1)
        if len(origins) == 0:
            return cls(
                np.zeros((0, history), np.float32), np.zeros((0, horizon), np.float32),
                np.zeros(0, np.int64), np.zeros(0, np.int64),
            )  # fmt: skip
        rows = np.repeat(np.arange(heat.shape[0]), len(origins))
        starts = np.tile(origins, heat.shape[0])
        past = starts[:, None] + np.arange(-history, 0)[None, :]  # (B, L)
        ahead = starts[:, None] + np.arange(horizon)[None, :]  # (B, T)
        return cls(
            heat[rows[:, None], past].astype(np.float32),
            heat[rows[:, None], ahead].astype(np.float32),
            rows,
            starts,
        )

    def subsample(self, count: int, seed: int = 0) -> HeatWindows:
        if count >= len(self):
            return self
        pick = np.sort(np.random.default_rng(seed).choice(len(self), count, replace=False))
        return HeatWindows(
            self.history[pick], self.continuation[pick], self.rows[pick], self.origins[pick]
        )


@dataclass(frozen=True)
class HeatSplit:
    """Train and held-back windows of one (K, N) heat matrix, split in time."""

    train: HeatWindows
    held_back: HeatWindows
    split: int  # first held-back bucket

    @classmethod
    def build(
        cls, heat: np.ndarray, history: int, horizon: int, eval_frac: float = 0.25
    ) -> HeatSplit:
        """Train windows end before the split; held-back windows' continuations start at or
        after it (their histories may reach back before it: that is the past they are given)."""
        if not 0 < eval_frac < 1:
            raise ValueError("eval_frac must be in (0, 1)")
        heat = np.atleast_2d(heat)
        n = heat.shape[1]
        split = round(n * (1 - eval_frac))
        if split < history + horizon or n - split < horizon:
            raise ValueError(
                f"{n} buckets are too few for history {history}, horizon {horizon} and "
                f"eval_frac {eval_frac}"
            )
        return cls(
            HeatWindows.cut(heat, history, horizon, last=split - horizon),
            HeatWindows.cut(heat, history, horizon, first=split),
            split,
        )

"""Learned hot-set scorers: the attention model per key, the online refit, and the experts' list.

`AttentionScorer` ranks keys by the attention model's forecast of their next-window requests. It
reads each key's history at `sub` buckets per window (a window of 60 s is six 10 s buckets), so
the model sees *when* inside the last windows a key was asked for, at three scales, and it is
trained on every key at once with the long-tail sample weights, so a key seen twice is not
drowned by the head.

`FeatureBoost` (`hotset_features`) boosts a correction to the EWMA frequency from per-key
features (turns, recency, age, gap rhythm); it is the fourth candidate, fitted once. The fifth
is the same booster refitted at every window boundary on all windows before it
(`OnlineRefit`), as a planner that retrains each window runs it: the traffic drifts, and a
model fitted once cannot learn what only later windows show.

`default_candidates` lists them for `hotset_combination.PreheatHotset`, which combines them
online (until 2026-12-02 it chose one on held-back windows; the figures below are from then).

Mooncake synthetic trace, 60 s, K = 50 (fitting windows 0..7, validation 6..7, evaluation
8..16). Among keys with two or more turns, the mean requests in the next window hardly depend
on the time since their last request through window 11 (0.21 to 0.27 across since-last bins in
windows 6..7, 0.33 to 0.41 in windows 10..11); from window 12 they fall steeply with it
(windows 14..16: 1.30 for keys seen in the last half window, 0.09 for keys idle over 4
windows), and the share of requests from keys seen before climbs from 0.28 (window 6) to 0.98
(window 16). Validation / evaluated recall: ewma_frequency 0.0495 / 0.1475, decayed_frequency
0.0473 / 0.1469, attention 0.027 / -, feature_boost (fit once) 0.0515 / 0.1388,
feature_boost_online 0.0556 / 0.1493, so preheat keeps the online booster and recalls 0.1493
(last_window 0.1367). Its refits choose 2 to 4 rounds at windows 8..9 and 15 to 27 rounds with
half-lives of 1 to 4 windows from window 12: it learns the recency weight as it appears. The
margin over the EWMA is small (under one request per window) and the choice rule matters: the
same online booster choosing by recall at K instead of log loss recalled 0.138, and with log
loss averaged over the last 1, 2 or 3 windows or all past windows instead of the last third,
0.145, 0.150, 0.151 and 0.134. Re-chosen every window (`OnlineRefit`, not candidates), the EWMA
recalls 0.1435 and the decayed frequency 0.1459: re-choosing a decay alone does not follow
this drift. Elsewhere on the trace the validation windows are early and the online booster
is not chosen: at K = 20 preheat keeps the fit-once booster, 0.0811 against the EWMA's 0.0796
(0.0766 with the decayed frequency it chose when the booster picked rounds by recall); at
K = 100 and at 30 s and 120 s windows it keeps the decayed frequency, as before (0.2379 vs
0.2322, 0.1620 vs 0.1626, 0.1119 vs 0.1107).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from models.forecast.attention import AttentionConfig, ForecastModule, predict, train_module
from models.forecast.hotset import DecayedFrequency, EwmaFrequency, HotsetScorer, KeyWindows
from models.forecast.hotset_features import BoostCache, FeatureBoost
from models.forecast.weighting import key_weights


def fine_counts(kw: KeyWindows, w: int, sub: int) -> np.ndarray:
    """(n_keys, w * sub) requests per key in sub-window buckets, from requests before window w."""
    b = kw.before(w)
    width = kw.window_s / sub
    bucket = np.minimum(((kw.times[:b] - kw.starts[0]) // width).astype(np.int64), w * sub - 1)
    counts = np.zeros((kw.n_keys, w * sub))
    np.add.at(counts, (kw.codes[:b], bucket), 1.0)
    return counts


class AttentionScorer:
    """Score = the attention model's forecast of a key's requests in the next window."""

    def __init__(self, k: int, sub: int = 6, config: AttentionConfig | None = None) -> None:
        self.k, self.sub = k, sub
        self.config = config or AttentionConfig(
            scales=(1, sub, 3 * sub), context=2 * sub, horizon=sub, epochs=8, batch_size=512
        )
        if self.config.horizon != sub:
            raise ValueError("the horizon must be one window: `sub` buckets")
        self.module: ForecastModule | None = None

    def fit(self, kw: KeyWindows, until: int) -> AttentionScorer:
        counts = fine_counts(kw, until, self.sub)  # (K, T) from windows < until only
        seen = np.flatnonzero(counts.sum(1) > 0)
        origins = np.arange(self.sub, counts.shape[1] - self.sub + 1, max(1, self.sub // 2))
        if len(seen) == 0 or len(origins) == 0:
            raise ValueError(f"windows before {until} are too few to train the attention scorer")
        rows = np.repeat(seen, len(origins))  # (K_seen * O,)
        weights = np.repeat(key_weights(counts[seen]), len(origins))
        self.module = train_module(counts, rows, np.tile(origins, len(seen)), self.config, weights)
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if self.module is None:
            raise RuntimeError("fit the attention scorer first")
        if w == 0:
            return np.zeros(kw.n_keys)
        counts = fine_counts(kw, w, self.sub)
        seen = np.flatnonzero(counts.sum(1) > 0)
        scores = np.zeros(kw.n_keys)
        forecast = predict(self.module, counts, seen, np.full(len(seen), counts.shape[1]))
        scores[seen] = forecast.sum(1) + 1e-9  # a seen key always outranks an unseen one
        return scores

    @property
    def params(self) -> dict[str, Any]:
        return {"sub": self.sub, "scales": list(self.config.scales), "epochs": self.config.epochs}


class OnlineRefit:
    """A scorer refitted at window boundaries on everything before them, as a planner runs it.

    `fit(kw, until)` fits a fresh scorer from `make` on windows < until. Scoring window w uses
    one fitted on windows < p, p the latest refit boundary <= w (`every` windows apart from
    `until`, so p = w when every = 1): no score for w reads w or later, and parameters chosen
    for the windows before `until` are not trusted on traffic that has moved since. A window
    before `until` gets a scorer fitted on the windows before it. If a refit finds nothing to
    fit (ValueError), the scorer of the boundary before it stands in: still the past only.

    Fitted scorers are kept by boundary, so scoring a window again refits nothing; give the
    factory's FeatureBoost a shared `BoostCache` and a refit fits only what is new. Wraps any
    `HotsetScorer`: `OnlineRefit(lambda: EwmaFrequency(k))` re-chooses the alpha every window.
    """

    def __init__(self, make: Callable[[], HotsetScorer], every: int = 1) -> None:
        if every < 1:
            raise ValueError("refit every 1 window or more")
        self.make, self.every = make, every
        self.until: int | None = None
        self.fitted: dict[int, HotsetScorer] = {}  # boundary -> scorer fitted on windows < it
        self._kw: KeyWindows | None = None

    def fit(self, kw: KeyWindows, until: int) -> OnlineRefit:
        """Fit on windows < until; the scorer's ValueError (nothing to fit on) passes through."""
        self._kw, self.until = kw, until
        self.fitted = {until: self.make().fit(kw, until)}
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if self.until is None:
            raise RuntimeError("fit the online scorer first")
        if kw is not self._kw:
            raise ValueError("score the trace the online scorer was fitted on")
        return self._at(kw, self._boundary(w)).scores(kw, w)

    def _boundary(self, w: int) -> int:
        assert self.until is not None
        if w <= self.until:
            return w
        return self.until + self.every * ((w - self.until) // self.every)

    def _at(self, kw: KeyWindows, boundary: int) -> HotsetScorer:
        assert self.until is not None
        if boundary not in self.fitted:
            try:
                self.fitted[boundary] = self.make().fit(kw, boundary)
            except ValueError:
                if boundary <= self.until:
                    raise
                self.fitted[boundary] = self._at(kw, boundary - self.every)
        return self.fitted[boundary]

    @property
    def params(self) -> dict[str, Any]:
        latest = self.fitted[max(self.fitted)] if self.fitted else None
        scalar = (int, float, str, bool, type(None))
        refits = {
            str(b): {n: v for n, v in getattr(s, "params", {}).items() if isinstance(v, scalar)}
            for b, s in sorted(self.fitted.items())
        }
        return {**getattr(latest, "params", {}), "refit_every": self.every, "refits": refits}


def default_candidates(k: int, seed: int = 0) -> dict[str, Callable[[], HotsetScorer]]:
    """Factories of what `preheat` chooses among (fresh objects: each fit starts clean), the
    simplest first: a tie on validation goes to the one listed first. The boosters share one
    `BoostCache`: validation and final fits, fit-once and online, reuse each other's work."""
    cache = BoostCache()
    return {
        "ewma_frequency": lambda: EwmaFrequency(k),
        "decayed_frequency": lambda: DecayedFrequency(k),
        "attention": lambda: AttentionScorer(k, config=None if seed == 0 else _seeded(seed)),
        "feature_boost": lambda: FeatureBoost(k, seed=seed, cache=cache),
        "feature_boost_online": lambda: OnlineRefit(
            lambda: FeatureBoost(k, seed=seed, cache=cache)
        ),
    }


def _seeded(seed: int) -> AttentionConfig:
    base = AttentionScorer(1).config
    return AttentionConfig(**{**base.__dict__, "seed": seed})

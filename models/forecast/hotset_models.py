"""Learned hot-set scorers: the attention model per key, and `preheat`, which chooses on validation.

`AttentionScorer` ranks keys by the attention model's forecast of their next-window requests. It
reads each key's history at `sub` buckets per window (a window of 60 s is six 10 s buckets), so
the model sees *when* inside the last windows a key was asked for, at three scales, and it is
trained on every key at once with the long-tail sample weights, so a key seen twice is not
drowned by the head.

`FeatureBoost` (`hotset_features`) boosts a correction to the EWMA frequency from per-key
features (turns, recency, age, gap rhythm); it is the fourth candidate.

`PreheatHotset` is what the warm-up planner uses: on the windows before the evaluation it holds
back the last `val_windows`, fits every candidate on what is before them, keeps the candidate
with the best recall there, and refits it on all the windows it may see. Like the total-series
`preheat`, it never picks on the windows it is scored on. Ties go to the candidate listed first,
and the list runs from the simplest: `FeatureBoost` falls back to exactly the EWMA ranking when
its held-back windows do not favour any boosting, and a tie must not then be read as a reason to
switch to the model that refits differently. (Ties used to go to the larger name.)

Mooncake synthetic trace, 60 s, K = 50 (fitting windows 0..7, validation 6..7): the features
carry no usable recency signal before window 8. Among keys with two or more turns, the mean
requests in the next window hardly depend on the time since their last request through window 11
(0.21 to 0.27 across since-last bins in windows 6..7, 0.33 to 0.41 in windows 10..11); only
from window 12 do they fall with it (windows 14..16: 1.30 for keys seen in the last half window,
0.09 for keys idle over 4 windows). A model fitted on windows < 8 cannot learn that weight; the
EWMA's decay has it by construction. So FeatureBoost ties the EWMA on validation (0 rounds
chosen) and preheat keeps the EWMA; refitted on windows < 8 it picks 14 rounds on windows 6..7
and recalls 0.138 of the evaluated windows' requests against the EWMA's 0.148. The same booster
started from a constant instead of the EWMA did worse: 0.047 on validation, 0.092 evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from models.forecast.attention import AttentionConfig, ForecastModule, predict, train_module
from models.forecast.hotset import DecayedFrequency, EwmaFrequency, HotsetScorer, KeyWindows
from models.forecast.hotset import mean_metrics as hotset_metrics
from models.forecast.hotset_features import FeatureBoost
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


def default_candidates(k: int, seed: int = 0) -> dict[str, Callable[[], HotsetScorer]]:
    """Factories of what `preheat` chooses among (fresh objects: each fit starts clean), the
    simplest first: a tie on validation goes to the one listed first."""
    return {
        "ewma_frequency": lambda: EwmaFrequency(k),
        "decayed_frequency": lambda: DecayedFrequency(k),
        "attention": lambda: AttentionScorer(k, config=None if seed == 0 else _seeded(seed)),
        "feature_boost": lambda: FeatureBoost(k, seed=seed),
    }


def _seeded(seed: int) -> AttentionConfig:
    base = AttentionScorer(1).config
    return AttentionConfig(**{**base.__dict__, "seed": seed})


class PreheatHotset:
    """Chooses among candidate scorers by recall on validation windows, then refits the winner.

    Ties go to the candidate listed first (`default_candidates` lists the simplest first).
    """

    def __init__(
        self,
        k: int,
        candidates: dict[str, Callable[[], HotsetScorer]] | None = None,
        val_windows: int = 3,
    ) -> None:
        self.k, self.val_windows = k, val_windows
        self.candidates = candidates or default_candidates(k)
        self.chosen = ""
        self.validation_recall: dict[str, float] = {}
        self.notes: list[str] = []
        self.model: HotsetScorer | None = None

    def fit(self, kw: KeyWindows, until: int) -> PreheatHotset:
        val_start = until - self.val_windows
        if val_start < 2:
            raise ValueError(
                f"{until} windows leave too few before the {self.val_windows} held back"
            )
        windows = range(val_start, until)
        for name, make in self.candidates.items():
            try:
                scorer = make().fit(kw, val_start)
            except ValueError as err:
                self.notes.append(f"{name} left out: {err}")
                continue
            self.validation_recall[name] = hotset_metrics(kw, scorer, self.k, windows)[1]
        if not self.validation_recall:
            raise ValueError("no hot-set candidate could be fitted: " + "; ".join(self.notes))
        recall = self.validation_recall
        self.chosen = max(recall, key=recall.__getitem__)  # the first of the best: simplest
        self.model = self.candidates[self.chosen]().fit(kw, until)
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("fit the preheat hot-set scorer first")
        return self.model.scores(kw, w)

    @property
    def params(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "validation_recall": self.validation_recall,
            "notes": self.notes,
            **getattr(self.model, "params", {}),
        }

"""Per-key features at a window boundary, from the past only, and the learned hot-set scorer.

Frequency scorers see one thing about a key: how many requests it had, discounted by age. A
conversation carries more than that: how many turns it has had, how long it has been going, how
long its turns are apart and whether the next one is due. `key_features` computes those for
every key seen before window w from the requests before w — the same prefix every other scorer
reads — so a model fitted on them cannot see the window it scores.

Times are in windows (seconds / window_s), so a model fitted at one window length reads features
on the scale the planner works at, and nothing here holds a number of seconds. There is no
"came in the last part of the window" flag: `since_last` < 1 says so, at whatever split the
trees find, where a flag would fix the fraction by hand. `FeatureBoost`
learns from them how a key's next-window requests differ from what its frequency says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor

from models.forecast.hotset import EwmaFrequency, KeyWindows, top_k, window_metrics

EWMA_ALPHAS = (0.2, 0.5)  # a slow and a fast memory, as in EwmaFrequency's grid

FEATURES = (
    "last_window",  # requests in window w-1
    *(f"ewma_{a:g}" for a in EWMA_ALPHAS),  # EWMA of window counts, as `EwmaFrequency` scores
    "turns",  # requests so far
    "since_last",  # windows from the key's latest request to the boundary
    "age",  # windows from the key's first request to the boundary
    "mean_gap",  # windows between its requests on average; NaN with one request
    "due",  # since_last / mean_gap: 1 when the next turn comes on the usual rhythm; NaN as above
)


def key_features(
    kw: KeyWindows, w: int, alphas: Sequence[float] = EWMA_ALPHAS
) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the keys seen before window w and their features at its start.

    Args:
        kw: the binned requests.
        w: the window the features are for; only requests in windows < w are read.
        alphas: the EWMA decays (len(alphas) EWMA columns, in `FEATURES` order by default).

    Returns:
        (codes, X): codes (n_seen,) ascending, X (n_seen, 6 + len(alphas)) float64 in the
        column order of `FEATURES`. Empty when no request comes before w.

    Raises:
        ValueError: w outside 0..n_windows, or an alpha outside (0, 1].
    """
    if not 0 <= w <= kw.n_windows:
        raise ValueError(f"window {w} is outside 0..{kw.n_windows}")
    if any(not 0 < a <= 1 for a in alphas):
        raise ValueError("every EWMA alpha must be in (0, 1]")
    b = kw.before(w)
    codes, times, window = kw.codes[:b], kw.times[:b], kw.window[:b]
    turns = np.bincount(codes, minlength=kw.n_keys).astype(np.float64)
    seen = np.flatnonzero(turns > 0)
    if not len(seen):
        return seen, np.empty((0, 6 + len(alphas)))
    start = kw.starts[w] if w < kw.n_windows else kw.starts[-1] + kw.window_s
    first = np.full(kw.n_keys, np.inf)
    np.minimum.at(first, codes, times)
    last = np.full(kw.n_keys, -np.inf)
    np.maximum.at(last, codes, times)
    age = (start - first[seen]) / kw.window_s  # (n_seen,)
    since_last = (start - last[seen]) / kw.window_s
    n = turns[seen]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_gap = np.where(n > 1, (age - since_last) / (n - 1), np.nan)
        due = np.where(mean_gap > 0, since_last / mean_gap, np.nan)
    in_last = np.bincount(codes[window == w - 1], minlength=kw.n_keys)[seen]
    ewmas = [
        np.bincount(codes, weights=a * (1.0 - a) ** (w - 1 - window), minlength=kw.n_keys)[seen]
        for a in alphas
    ]
    columns = [in_last, *ewmas, n, since_last, age, mean_gap, due]
    return seen, np.column_stack(columns).astype(np.float64)


def training_rows(
    kw: KeyWindows, windows: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(window, code, X, y) for every key seen before each window: features at its start, its
    request count in that window. The rows of window w read requests before w for X and the
    requests of w for y, so rows of windows < until read nothing from windows >= until."""
    parts = []
    for w in windows:
        codes, x = key_features(kw, w)
        parts.append((np.full(len(codes), w), codes, x, kw.row(w)[codes]))
    if not parts:
        return (
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            np.empty((0, len(FEATURES))),
            np.empty(0),
        )
    w_col, codes, x, y = (np.concatenate(p) for p in zip(*parts, strict=True))
    return w_col.astype(np.int64), codes, x, y


class FeatureBoost:
    """Score = the EWMA frequency prior x a correction boosted from the key features.

    A Poisson gradient-boosted model (sklearn's HistGradientBoostingRegressor) is fitted on every
    (key, window) pair before `until` — features at the window's start, the key's requests in
    the window — with the fitted `EwmaFrequency` score as its offset: fitting y / prior with
    weight prior is the same Poisson deviance as fitting y with mean prior x f(x). Each round
    then moves a key away from its frequency rank only where the features explain the counts
    better, and 0 rounds is the prior itself. The number of rounds is chosen the way the EWMA
    chooses its alpha, by recall at K, but on the last third of the fitting windows held back
    (in-sample recall would always ask for more rounds); the model is then refitted on them all.

    Rejected: boosting from a constant (the plain model). On few returning keys it learns
    whichever feature separated the fitting windows by chance and loses the frequency ranking,
    which is the strongest single signal in traffic whose conversations come back; an offset
    keeps that ranking unless the data argue against it (on the Mooncake trace, see
    `hotset_models`, the constant start fell below the EWMA on validation as well).

    Args:
        k: the K recall is measured at when choosing the rounds (use the evaluation's K).
        max_rounds: the most boosting rounds tried.
        seed: the booster's random_state.
        fit_windows: at most this many of the latest windows before `until` are fitted on: it
            bounds the rows (every key seen so far, per window) and follows drift.
    """

    def __init__(self, k: int, max_rounds: int = 100, seed: int = 0, fit_windows: int = 50) -> None:
        if k < 1 or max_rounds < 0 or fit_windows < 2:
            raise ValueError("need k >= 1, max_rounds >= 0 and fit_windows >= 2")
        self.k, self.max_rounds, self.seed, self.fit_windows = k, max_rounds, seed, fit_windows
        self.rounds = 0
        self.holdout_recall: dict[int, float] = {}
        self.prior: EwmaFrequency | None = None
        self.model: HistGradientBoostingRegressor | None = None

    def fit(self, kw: KeyWindows, until: int) -> FeatureBoost:
        """Fit on windows < until; raises ValueError when they hold nothing to learn from."""
        if not 1 <= until <= kw.n_windows:
            raise ValueError(f"until must be in 1..{kw.n_windows}")
        windows = range(max(1, until - self.fit_windows), until)  # window 0 has no past
        if len(windows) < 2:
            raise ValueError(f"windows before {until} are too few to fit and choose the rounds")
        held = windows[-max(1, len(windows) // 3) :]
        prior, model = self._fit_on(kw, windows[: -len(held)], self.max_rounds)
        self.holdout_recall = _recall_by_rounds(kw, prior, model, held, self.k)
        best = max(self.holdout_recall.values())
        self.rounds = min(r for r, recall in self.holdout_recall.items() if recall == best)
        self.prior, self.model = self._fit_on(kw, windows, self.rounds)
        return self

    def _fit_on(
        self, kw: KeyWindows, windows: range, rounds: int
    ) -> tuple[EwmaFrequency, HistGradientBoostingRegressor | None]:
        prior = EwmaFrequency(self.k).fit(kw, windows.stop)
        if rounds == 0:
            return prior, None
        w_col, codes, x, y = training_rows(kw, windows)
        if y.sum() <= 0:
            raise ValueError(f"no key came back in windows {windows.start}..{windows.stop - 1}")
        base = np.concatenate([_prior(kw, prior, w, codes[w_col == w]) for w in windows])
        model = HistGradientBoostingRegressor(
            loss="poisson",
            learning_rate=0.1,
            max_iter=rounds,
            max_leaf_nodes=8,
            min_samples_leaf=20,
            l2_regularization=1.0,
            early_stopping=False,  # the rounds are chosen on held-back windows, not random rows
            random_state=self.seed,
        )
        return prior, model.fit(x, y / base, sample_weight=base)

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if self.prior is None:
            raise RuntimeError("fit the feature-boost scorer first")
        scores = np.zeros(kw.n_keys)
        codes, x = key_features(kw, w)
        if len(codes):
            base = _prior(kw, self.prior, w, codes)
            scores[codes] = base if self.model is None else base * self.model.predict(x)
        return scores

    @property
    def params(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "prior_alpha": None if self.prior is None else self.prior.alpha,
            "holdout_recall_at_0": self.holdout_recall.get(0),
            "holdout_recall_best": max(self.holdout_recall.values(), default=None),
            "features": list(FEATURES),
            "seed": self.seed,
        }


def _prior(kw: KeyWindows, prior: EwmaFrequency, w: int, codes: np.ndarray) -> np.ndarray:
    """The EWMA score of `codes` (keys seen before w), floored at 1e-3 x the window's smallest
    positive one: at alpha = 1 a key missing from the last window scores 0, and a zero offset
    would leave it out of the top K whatever the features say."""
    base = prior.scores(kw, w)[codes]
    positive = base[base > 0]
    return np.maximum(base, 1e-3 * positive.min()) if len(positive) else np.ones(len(codes))


def _recall_by_rounds(
    kw: KeyWindows,
    prior: EwmaFrequency,
    model: HistGradientBoostingRegressor | None,
    windows: range,
    k: int,
) -> dict[int, float]:
    """Mean recall at K over `windows` (those with requests) after each number of rounds."""
    per_window = []
    for w in windows:
        counts = kw.row(w)
        codes, x = key_features(kw, w)
        if counts.sum() == 0 or not len(codes):
            continue
        base = _prior(kw, prior, w, codes)
        stages = [np.ones(len(codes))]
        if model is not None:
            stages += list(model.staged_predict(x))
        recalls = []
        for factor in stages:
            scores = np.zeros(kw.n_keys)
            scores[codes] = base * factor
            recalls.append(window_metrics(counts, top_k(scores, k, kw.last_seen(w)), k)[1])
        per_window.append(recalls)
    if not per_window:
        return {0: 0.0}
    return {r: float(v) for r, v in enumerate(np.mean(per_window, axis=0))}

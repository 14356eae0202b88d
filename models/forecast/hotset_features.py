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

A planner refits at every window boundary (`hotset_models.OnlineRefit`), and each refit reads
nearly the same windows as the last: `BoostCache` keeps the features of a window, the prior and
booster fitted at a boundary and their one-step-ahead losses, so a refit only fits what is new.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor

from models.forecast.hotset import EwmaFrequency, KeyWindows

EWMA_ALPHAS = (0.2, 0.5)  # a slow and a fast memory, as in EwmaFrequency's grid
# Half-lives, in windows, of the weight of a training window by its age; None: all weigh the
# same. The first is the simplest: ties go to it.
HALF_LIVES: tuple[float | None, ...] = (None, 8.0, 4.0, 2.0, 1.0)

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
    kw: KeyWindows,
    windows: Sequence[int],
    features: Callable[[KeyWindows, int], tuple[np.ndarray, np.ndarray]] = key_features,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(window, code, X, y) for every key seen before each window: features at its start, its
    request count in that window. The rows of window w read requests before w for X and the
    requests of w for y, so rows of windows < until read nothing from windows >= until.
    `features` is `key_features` or a cached equivalent."""
    parts = []
    for w in windows:
        codes, x = features(kw, w)
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


class BoostCache:
    """Values computed from one `KeyWindows` by `FeatureBoost` fits, computed once.

    Everything kept is a function of (the trace, a window or boundary, the parameters in its
    key): a window's features, the EWMA prior and the booster fitted at a boundary, a booster's
    one-step-ahead loss on the window it was fitted for. So a cached value is the value a fresh
    fit would compute, and one cache may be shared by every `FeatureBoost` on the trace (the
    fit-once and online candidates, their validation and final fits). It holds one trace:
    another `KeyWindows` object clears it (identity, not equality: two traces that differ only
    after window w must not share the booster fitted on windows < w + 1).

    Rejected: a module-level cache. It would outlive the trace it describes and couple tests
    that happen to build equal traces; injected, its lifetime is the caller's.
    """

    def __init__(self) -> None:
        self._kw: KeyWindows | None = None
        self._values: dict[Hashable, Any] = {}

    def get(self, kw: KeyWindows, key: Hashable, compute: Callable[[], Any]) -> Any:
        if kw is not self._kw:
            self._kw, self._values = kw, {}
        if key not in self._values:
            self._values[key] = compute()
        return self._values[key]

    def features(self, kw: KeyWindows, w: int) -> tuple[np.ndarray, np.ndarray]:
        """`key_features(kw, w)`, cached."""
        return self.get(kw, ("features", w), lambda: key_features(kw, w))


class FeatureBoost:
    """Score = the EWMA frequency prior x a correction boosted from the key features.

    A Poisson gradient-boosted model (sklearn's HistGradientBoostingRegressor) is fitted on every
    (key, window) pair before `until` — features at the window's start, the key's requests in
    the window — with the fitted `EwmaFrequency` score as its offset: fitting y / prior with
    weight prior is the same Poisson deviance as fitting y with mean prior x f(x). Each round
    then moves a key away from its frequency rank only where the features explain the counts
    better, and 0 rounds is the prior itself. The rows of a training window u windows older
    than the latest also weigh 2^(-u / half-life): traffic drifts, and the latest windows say
    most about the next.

    The half-life and the rounds are chosen together on the last third of the fitting windows,
    each the way the planner would have used it there: for every held-back window v, the model
    fitted on the windows before v predicts v (one step ahead; a single split would judge the
    held-back windows with a model that never saw the latest of them). They are compared by
    the log loss of where v's returning requests went: the mean of -log(the share of the
    predicted total that their key got). That is a proper score over every returning key and
    blind to the window's level, which drifts and does not change a ranking. Rejected: recall
    at K (the old rule). It moves only when a key crosses the K-th rank, a few requests per
    window, and the best of 5 half-lives x 101 rounds by it was noise (on the Mooncake trace,
    see `hotset_models`). Ties (every half-life at 0 rounds is the prior) go to no decay, then
    to fewer rounds.

    Rejected: boosting from a constant (the plain model). On few returning keys it learns
    whichever feature separated the fitting windows by chance and loses the frequency ranking,
    which is the strongest single signal in traffic whose conversations come back; an offset
    keeps that ranking unless the data argue against it (on the Mooncake trace, see
    `hotset_models`, the constant start fell below the EWMA on validation as well).

    Args:
        k: the K of the prior's EWMA fit (use the evaluation's K).
        max_rounds: the most boosting rounds tried.
        seed: the booster's random_state.
        fit_windows: at most this many of the latest windows before `until` are fitted on: it
            bounds the rows (every key seen so far, per window) and follows drift.
        half_lives: the sample-weight half-lives tried, in windows (None: no decay).
        cache: shared fitted state (see `BoostCache`); a private one when None.
    """

    def __init__(
        self,
        k: int,
        max_rounds: int = 100,
        seed: int = 0,
        fit_windows: int = 50,
        half_lives: Sequence[float | None] = HALF_LIVES,
        cache: BoostCache | None = None,
    ) -> None:
        if k < 1 or max_rounds < 0 or fit_windows < 2 or not half_lives:
            raise ValueError("need k >= 1, max_rounds >= 0, fit_windows >= 2 and a half-life")
        if any(h is not None and not h > 0 for h in half_lives):
            raise ValueError("every half-life must be positive (or None: no decay)")
        self.k, self.max_rounds, self.seed, self.fit_windows = k, max_rounds, seed, fit_windows
        self.half_lives = tuple(half_lives)
        self.cache = cache if cache is not None else BoostCache()
        self.rounds, self.half_life = 0, self.half_lives[0]
        self.holdout_loss: np.ndarray | None = None  # (len(half_lives), max_rounds + 1)
        self.prior: EwmaFrequency | None = None
        self.model: HistGradientBoostingRegressor | None = None

    def fit(self, kw: KeyWindows, until: int) -> FeatureBoost:
        """Fit on windows < until; raises ValueError when they hold nothing to learn from."""
        if not 1 <= until <= kw.n_windows:
            raise ValueError(f"until must be in 1..{kw.n_windows}")
        windows = self._windows(until)
        if len(windows) < 2:
            raise ValueError(f"windows before {until} are too few to fit and choose the rounds")
        if training_rows(kw, windows, self.cache.features)[3].sum() <= 0:
            raise ValueError(f"no key came back in windows {windows.start}..{windows.stop - 1}")
        held = windows[-max(1, len(windows) // 3) :]
        self.holdout_loss = np.stack([self._held_loss(kw, held, h) for h in self.half_lives])
        best = int(np.argmin(self.holdout_loss))  # the first minimum: h-major, rounds ascending
        h_index, self.rounds = divmod(best, self.max_rounds + 1)
        self.half_life = self.half_lives[h_index]
        self.prior, self.model = self._fitted(kw, until, self.half_life)
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if self.prior is None:
            raise RuntimeError("fit the feature-boost scorer first")
        scores = np.zeros(kw.n_keys)
        codes, x = self.cache.features(kw, w)
        if len(codes):
            base = _prior(kw, self.prior, w, codes)
            scores[codes] = base * _staged(self.model, x, self.rounds)[-1]
        return scores

    def _windows(self, until: int) -> range:
        return range(max(1, until - self.fit_windows), until)  # window 0 has no past

    def _key(self, *rest: Hashable) -> tuple[Hashable, ...]:
        return (self.k, self.max_rounds, self.seed, self.fit_windows, *rest)

    def _fitted(
        self, kw: KeyWindows, until: int, half_life: float | None
    ) -> tuple[EwmaFrequency, HistGradientBoostingRegressor | None]:
        """The prior and the max_rounds booster fitted on windows < until (None: no rounds, or
        no key came back there and there is nothing to boost)."""

        def fit() -> tuple[EwmaFrequency, HistGradientBoostingRegressor | None]:
            prior = self.cache.get(
                kw, ("prior", self.k, until), lambda: EwmaFrequency(self.k).fit(kw, until)
            )
            windows = self._windows(until)
            w_col, codes, x, y = training_rows(kw, windows, self.cache.features)
            if self.max_rounds == 0 or y.sum() <= 0:
                return prior, None
            base = np.concatenate([_prior(kw, prior, w, codes[w_col == w]) for w in windows])
            age = until - 1 - w_col  # (rows,) windows between the row's and the boundary
            weight = base if half_life is None else base * 0.5 ** (age / half_life)
            model = HistGradientBoostingRegressor(
                loss="poisson",
                learning_rate=0.1,
                max_iter=self.max_rounds,
                max_leaf_nodes=8,
                min_samples_leaf=20,
                l2_regularization=1.0,
                early_stopping=False,  # the rounds are chosen on held-back windows, not rows
                random_state=self.seed,
            )
            return prior, model.fit(x, y / base, sample_weight=weight)

        return self.cache.get(kw, self._key("fit", until, half_life), fit)

    def _held_loss(self, kw: KeyWindows, held: range, half_life: float | None) -> np.ndarray:
        """(max_rounds + 1,) mean one-step-ahead log loss over the held windows with returning
        requests, by rounds; zeros when none has any (then 0 rounds, the prior, is kept)."""
        losses = [loss for v in held if (loss := self._loss(kw, v, half_life)) is not None]
        return np.mean(losses, axis=0) if losses else np.zeros(self.max_rounds + 1)

    def _loss(self, kw: KeyWindows, v: int, half_life: float | None) -> np.ndarray | None:
        """Log loss on window v of the model fitted on windows < v, after 0..max_rounds rounds;
        None when no key seen before v comes back in v. Reads window v: call it only from a
        fit at a later boundary."""

        def compute() -> np.ndarray | None:
            codes, x = self.cache.features(kw, v)
            y = kw.row(v)[codes]
            if y.sum() <= 0:
                return None
            prior, model = self._fitted(kw, v, half_life)
            base, back = _prior(kw, prior, v, codes), y > 0
            return np.array(
                [
                    -(y[back] * np.log(mu[back] / mu.sum())).sum() / y.sum()
                    for mu in (base * f for f in _staged(model, x, self.max_rounds))
                ]
            )

        return self.cache.get(kw, self._key("loss", v, half_life), compute)

    @property
    def params(self) -> dict[str, Any]:
        loss = self.holdout_loss
        return {
            "rounds": self.rounds,
            "half_life_windows": self.half_life,
            "prior_alpha": None if self.prior is None else self.prior.alpha,
            "holdout_log_loss_at_0": None if loss is None else float(loss[0, 0]),
            "holdout_log_loss_best": None if loss is None else float(loss.min()),
            "features": list(FEATURES),
            "seed": self.seed,
        }


def _staged(
    model: HistGradientBoostingRegressor | None, x: np.ndarray, rounds: int
) -> list[np.ndarray]:
    """The correction factors after 0..rounds rounds (the last repeated past the model's)."""
    stages = [np.ones(len(x))]
    if model is not None and rounds > 0 and len(x):
        for factor in model.staged_predict(x):
            stages.append(factor)
            if len(stages) > rounds:
                break
    return stages + [stages[-1]] * (rounds + 1 - len(stages))


def _prior(kw: KeyWindows, prior: EwmaFrequency, w: int, codes: np.ndarray) -> np.ndarray:
    """The EWMA score of `codes` (keys seen before w), floored at 1e-3 x the window's smallest
    positive one: at alpha = 1 a key missing from the last window scores 0, and a zero offset
    would leave it out of the top K whatever the features say."""
    base = prior.scores(kw, w)[codes]
    positive = base[base > 0]
    return np.maximum(base, 1e-3 * positive.min()) if len(positive) else np.ones(len(codes))

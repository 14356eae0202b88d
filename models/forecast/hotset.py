"""Per-key hot-set prediction: which K keys will get the most requests in the next window.

The warm-up planner fills the cache at each window boundary, so what matters is ranking keys
from the past only. Requests are binned into fixed windows (`KeyWindows`); a `HotsetScorer`
scores every key at the start of window w from what happened before it; its top K (keys with a
positive score) is compared with the next window's actual counts:

- precision_at_k: |predicted ∩ true top K| / K;
- recall_of_requests: the share of the window's requests whose key was predicted.

`Oracle` scores with the window's own counts: it is the limit, not a method. Keys are integer
codes of arbitrary ids (Mooncake prefix keys today, templates later), so nothing here knows
where keys come from; `cache_runtime.traces.load_request_keys` reads them from a trace.

Fitting and evaluation split at one window, `first_eval_window`: every scorer is fitted on the
windows before it and evaluated on it and everything after, so every method is scored on the
same windows and no fitted parameter has seen them. The preheat chooser (added later) picks its
method on the same split, for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd
from scipy import sparse

from cache_runtime.heat import decay_rate

ALPHA_GRID = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
HALF_LIFE_GRID_WINDOWS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # half-lives, in windows


@dataclass(frozen=True, eq=False)
class KeyWindows:
    """Requests binned into whole windows of `window_s` seconds from the first request.

    The final window is dropped when the trace ends inside it (`dropped` counts its requests):
    a partial window has fewer requests, so it would make recall and the hot set look unlike
    every other window. Requests are kept sorted by time, so "before window w" is a prefix.
    """

    times: np.ndarray  # (N,) float64 seconds of the kept requests, ascending
    codes: np.ndarray  # (N,) int64 key code of each kept request
    window: np.ndarray  # (N,) int64 window of each kept request, ascending
    keys: np.ndarray  # (n_keys,) the key each code stands for
    starts: np.ndarray  # (n_windows,) float64 start of each window, seconds
    counts: sparse.csr_array  # (n_windows, n_keys) int64 requests per window and key
    window_s: float
    dropped: int  # requests in the dropped final partial window

    @classmethod
    def build(cls, times: np.ndarray, keys: np.ndarray, window_s: float) -> KeyWindows:
        """Bin (times, keys) into windows; keys may be any hashable ids (mapped to codes).

        Raises:
            ValueError: mismatched or non-finite input, or a trace shorter than one window.
        """
        times = np.asarray(times, dtype=np.float64)
        keys = np.asarray(keys)
        if times.ndim != 1 or keys.shape != times.shape:
            raise ValueError("times and keys must be 1-D arrays of the same length")
        if not window_s > 0 or not np.isfinite(window_s):
            raise ValueError("window_s must be a positive number of seconds")
        if not len(times) or not np.all(np.isfinite(times)):
            raise ValueError("times must be a non-empty array of finite seconds")
        order = np.argsort(times, kind="stable")
        times, keys = times[order], keys[order]
        window = np.floor((times - times[0]) / window_s).astype(np.int64)
        n_windows = int(np.floor((times[-1] - times[0]) / window_s))
        if n_windows < 1:
            raise ValueError(f"the trace spans less than one {window_s:g} s window")
        keep = window < n_windows
        codes, uniques = _factorize(keys[keep])
        window = window[keep]
        counts = sparse.csr_array(
            (np.ones(len(codes), dtype=np.int64), (window, codes)),
            shape=(n_windows, len(uniques)),
        )  # duplicate (window, key) entries are summed: the request counts
        starts = times[0] + window_s * np.arange(n_windows, dtype=np.float64)
        dropped = int(len(keep) - keep.sum())
        return cls(times[keep], codes, window, uniques, starts, counts, float(window_s), dropped)

    @classmethod
    def from_counts(
        cls,
        window: np.ndarray,
        keys: np.ndarray,
        counts: np.ndarray,
        window_s: float,
        start_s: float,
        n_windows: int,
    ) -> KeyWindows:
        """Windows from per-(window, key) request counts, such as the lake's demand series at
        one granularity: each request is placed mid-window (what the counts do not say). Windows
        without a count are empty, so `n_windows` may run past the last count: the planner's
        next window, scored from the ones before it.

        Raises:
            ValueError: mismatched input, a window outside [0, n_windows) or a count below 1.
        """
        window = np.asarray(window, dtype=np.int64)
        counts = np.asarray(counts)
        keys = np.asarray(keys)
        if not (window.ndim == 1 and keys.shape == window.shape == counts.shape):
            raise ValueError("window, keys and counts must be 1-D arrays of the same length")
        if not window_s > 0 or not np.isfinite(window_s) or n_windows < 1:
            raise ValueError("window_s must be positive and n_windows at least 1")
        if len(window) and (window.min() < 0 or window.max() >= n_windows):
            raise ValueError(f"every window must be in [0, {n_windows})")
        if len(counts) and not (np.all(counts >= 1) and np.all(counts == np.floor(counts))):
            raise ValueError("counts must be whole numbers of requests, at least 1")
        repeats = counts.astype(np.int64)
        order = np.argsort(window, kind="stable")
        window, keys, repeats = window[order], keys[order], repeats[order]
        codes, uniques = _factorize(keys)
        per_request = np.repeat(window, repeats)  # (N,) ascending: sorted by time
        times = start_s + window_s * (per_request + 0.5)
        matrix = sparse.csr_array(
            (repeats, (window, codes)), shape=(n_windows, len(uniques))
        )  # one entry per (window, key) row; duplicates summed
        starts = start_s + window_s * np.arange(n_windows, dtype=np.float64)
        return cls(
            times, np.repeat(codes, repeats), per_request, uniques, starts, matrix,
            float(window_s), 0,
        )  # fmt: skip

    @property
    def n_windows(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_keys(self) -> int:
        return int(self.counts.shape[1])

    def before(self, w: int) -> int:
        """How many requests fall in windows < w (they are the first ones: sorted by time)."""
        return int(np.searchsorted(self.window, w, side="left"))

    def row(self, w: int) -> np.ndarray:
        """(n_keys,) float64 request counts of window w."""
        return self.counts[w : w + 1].toarray()[0].astype(np.float64)

    def last_seen(self, w: int) -> np.ndarray:
        """(n_keys,) float64 time of each key's latest request before window w; -inf if none."""
        last = np.full(self.n_keys, -np.inf)
        b = self.before(w)
        np.maximum.at(last, self.codes[:b], self.times[:b])
        return last


def _factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes in key order where keys sort (ints do), else in order of first appearance."""
    try:
        codes, uniques = pd.factorize(keys, sort=True)
    except TypeError:  # mixed types that do not compare
        codes, uniques = pd.factorize(keys, sort=False)
    return codes.astype(np.int64), np.asarray(uniques)


@runtime_checkable
class HotsetScorer(Protocol):
    """Scores every key at the start of a window, from the past only."""

    def fit(self, kw: KeyWindows, until: int) -> HotsetScorer:
        """Choose parameters using windows < until only; returns self."""
        ...

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        """(n_keys,) float64 scores for window w, from requests in windows < w only."""
        ...


def top_k(scores: np.ndarray, k: int, last_seen: np.ndarray) -> np.ndarray:
    """Codes of the K best keys with a positive score, best first.

    Ties go to the key seen more recently, then to the lower code: deterministic, and recency
    is the better guess (a key just requested is likelier to come back) than an arbitrary order.
    """
    candidates = np.flatnonzero(scores > 0)
    order = np.lexsort((candidates, -last_seen[candidates], -scores[candidates]))
    return candidates[order[:k]]


def window_metrics(counts: np.ndarray, predicted: np.ndarray, k: int) -> tuple[float, float]:
    """(precision_at_k, recall_of_requests) of `predicted` codes against one window's counts.

    The true top K is ambiguous when keys tie at the K-th count (with ~230 requests over ~2,000
    keys most windows have dozens of keys seen once). Precision takes the true top K that agrees
    most with the prediction: every key above the K-th count, plus as many of the tied keys as
    the prediction holds, up to the free slots. Breaking those ties by any fixed rule instead
    would reward a method for matching the rule, not the traffic. The oracle scores 1 whenever
    the window has at least K requested keys.
    """
    total = counts.sum()
    recall = float(counts[predicted].sum() / total) if total > 0 else 0.0
    kth = float(-np.partition(-counts, k - 1)[k - 1]) if len(counts) >= k else 0.0
    above = counts > kth
    hits = int(above[predicted].sum())
    if kth > 0:
        tied = int((counts[predicted] == kth).sum())
        hits += min(k - int(above.sum()), tied)
    return hits / k, recall


def mean_metrics(
    kw: KeyWindows, scorer: HotsetScorer, k: int, windows: Sequence[int]
) -> tuple[float, float, int]:
    """Mean (precision_at_k, recall_of_requests) over `windows` with requests, and their number.

    A window without requests has no hot set to predict; it is skipped for every method alike.
    """
    results = []
    for w in windows:
        counts = kw.row(w)
        if counts.sum() > 0:
            predicted = top_k(scorer.scores(kw, w), k, kw.last_seen(w))
            results.append(window_metrics(counts, predicted, k))
    if not results:
        return 0.0, 0.0, 0
    precision, recall = np.mean(results, axis=0)
    return float(precision), float(recall), len(results)


def _pick(
    kw: KeyWindows, until: int, k: int, grid: Sequence[float], make: Callable[[float], Any]
) -> tuple[float, float] | None:
    """The grid value whose scorer has the best mean recall on windows 1..until-1, and that
    recall; None when there is nothing to fit on. Ties go to the earlier grid value."""
    windows = range(1, min(until, kw.n_windows))  # window 0 has no past: every scorer scores 0
    if not grid or not windows:
        return None
    recalls = [mean_metrics(kw, make(value), k, windows)[1] for value in grid]
    best = int(np.argmax(recalls))
    return float(grid[best]), float(recalls[best])


class LastWindow:
    """The previous window's counts: the planner that warms what was just hot."""

    def fit(self, kw: KeyWindows, until: int) -> LastWindow:
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        return kw.row(w - 1) if w > 0 else np.zeros(kw.n_keys)

    @property
    def params(self) -> dict[str, Any]:
        return {}


class Oracle:
    """The window's own counts: the best any top K can do. Reads the future by design."""

    def fit(self, kw: KeyWindows, until: int) -> Oracle:
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        return kw.row(w)

    @property
    def params(self) -> dict[str, Any]:
        return {}


class EwmaFrequency:
    """Per-key EWMA of window counts: s_w = alpha x c_{w-1} + (1 - alpha) x s_{w-1}, s_0 = 0.

    Scoring sums each past request's weight alpha (1 - alpha)^(age in windows) with one bincount,
    so the score for window w is computed from requests before it and nothing else — no state
    carried between calls that a later window could have touched.

    Args:
        k: the K that `fit` maximises recall at (use the evaluation's K).
        alpha: used as is when `fit` has no windows (or `grid` is empty).
        grid: the alphas `fit` tries.
    """

    def __init__(self, k: int, alpha: float = 0.3, grid: Sequence[float] = ALPHA_GRID) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.k, self.alpha, self.grid = k, alpha, tuple(grid)
        self.fit_recall: float | None = None

    def fit(self, kw: KeyWindows, until: int) -> EwmaFrequency:
        picked = _pick(kw, until, self.k, self.grid, lambda a: EwmaFrequency(self.k, a, ()))
        if picked is not None:
            self.alpha, self.fit_recall = picked
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        b = kw.before(w)
        age = w - 1 - kw.window[:b]  # (b,) windows between each request and window w
        weights = self.alpha * (1.0 - self.alpha) ** age
        return np.bincount(kw.codes[:b], weights=weights, minlength=kw.n_keys)

    @property
    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "fit_recall": self.fit_recall}


class DecayedFrequency:
    """The platform's heat: each past request weighted exp(-ln 2 x age / half-life), summed per
    key at the window's start (`cache_runtime.heat`). Unlike the EWMA it sees *when* in a window
    a request came, so a key requested just before the boundary outranks one requested early.

    Args:
        k: the K that `fit` maximises recall at.
        half_life_s: used as is when `fit` has no windows (or the grid is empty).
        grid_s: the half-lives `fit` tries; default `HALF_LIFE_GRID_WINDOWS` times the window,
            so the grid follows the time scale the planner works at.
    """

    def __init__(
        self, k: int, half_life_s: float = 300.0, grid_s: Sequence[float] | None = None
    ) -> None:
        decay_rate(half_life_s)  # validates: positive
        self.k, self.half_life_s = k, half_life_s
        self.grid_s = None if grid_s is None else tuple(grid_s)
        self.fit_recall: float | None = None

    def fit(self, kw: KeyWindows, until: int) -> DecayedFrequency:
        grid = self.grid_s
        if grid is None:
            grid = tuple(m * kw.window_s for m in HALF_LIFE_GRID_WINDOWS)
        picked = _pick(kw, until, self.k, grid, lambda h: DecayedFrequency(self.k, h, ()))
        if picked is not None:
            self.half_life_s, self.fit_recall = picked
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        b = kw.before(w)
        age = kw.starts[w] - kw.times[:b]  # (b,) seconds before the boundary, > 0
        weights = np.exp(-decay_rate(self.half_life_s) * age)
        return np.bincount(kw.codes[:b], weights=weights, minlength=kw.n_keys)

    @property
    def params(self) -> dict[str, Any]:
        return {"half_life_s": self.half_life_s, "fit_recall": self.fit_recall}


def default_scorers(k: int) -> dict[str, HotsetScorer]:
    """The baselines and the limit, all fitting at the same K."""
    return {
        "last_window": LastWindow(),
        "ewma_frequency": EwmaFrequency(k),
        "decayed_frequency": DecayedFrequency(k),
        "oracle": Oracle(),
    }


def evaluate_hotset(
    kw: KeyWindows, scorers: dict[str, HotsetScorer], k: int, first_eval_window: int
) -> dict[str, Any]:
    """Fit every scorer on windows < first_eval_window, then score windows first_eval_window..end.

    Returns:
        {"windows": evaluated windows (those with requests), "k", "first_eval_window",
        "methods": {name: {"precision_at_k", "recall_of_requests"}}, "params": {name: fitted}}.

    Raises:
        ValueError: k < 1, first_eval_window outside 1..n_windows-1, or a scorer fitting at
            another K (its parameters would be chosen for a different question).
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    for name, scorer in scorers.items():
        fit_k = getattr(scorer, "k", k)
        if fit_k != k:
            raise ValueError(f"scorer {name!r} fits at k={fit_k}, not k={k}")
    if not 1 <= first_eval_window < kw.n_windows:
        raise ValueError(f"first_eval_window must be in 1..{kw.n_windows - 1}")
    windows = range(first_eval_window, kw.n_windows)
    methods: dict[str, dict[str, float]] = {}
    params: dict[str, Any] = {}
    evaluated = 0
    for name, scorer in scorers.items():
        scorer.fit(kw, first_eval_window)
        precision, recall, evaluated = mean_metrics(kw, scorer, k, windows)
        methods[name] = {"precision_at_k": precision, "recall_of_requests": recall}
        params[name] = getattr(scorer, "params", {})
    return {
        "windows": evaluated,
        "k": k,
        "first_eval_window": first_eval_window,
        "methods": methods,
        "params": params,
    }

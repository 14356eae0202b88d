"""Key features and the feature-boosted hot-set scorer: exact features, the past only, patterns
that frequency misses, online refits (the past only, adapting to drift, cached = from scratch)
and the preheat chooser's tie rule and protocol."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from models.forecast.hotset import EwmaFrequency, KeyWindows, LastWindow, mean_metrics
from models.forecast.hotset_combination import PreheatHotset
from models.forecast.hotset_features import (
    FEATURES,
    BoostCache,
    FeatureBoost,
    key_features,
    training_rows,
)
from models.forecast.hotset_models import OnlineRefit

# 10 s windows from t=0: key 1 at 0, 5 (w0) and 12 (w1); key 2 at 15 (w1); key 3 at 25 (w2);
# key 4 at 31 only closes window 2 (its partial window is dropped).
HAND = [(0, 1), (5, 1), (12, 1), (15, 2), (25, 3), (31, 4)]
SMALL: dict[str, Any] = {"max_rounds": 20, "half_lives": (None, 1.0)}  # a quick search


def hand(extra: list[tuple[float, int]] = ()) -> KeyWindows:
    times, keys = zip(*sorted([*HAND, *extra]), strict=True)
    return KeyWindows.build(np.array(times, dtype=float), np.array(keys), 10.0)


def test_features_at_a_boundary_are_exact() -> None:
    kw = hand()
    codes, x = key_features(kw, 2)
    assert kw.keys[codes].tolist() == [1, 2]  # key 3 comes in window 2 itself: not yet seen
    row = dict(zip(FEATURES, x[0], strict=True))
    assert row == pytest.approx(
        {
            "last_window": 1.0,
            "ewma_0.2": 0.2 * 1 + 0.2 * 0.8 * 2,
            "ewma_0.5": 0.5 * 1 + 0.5 * 0.5 * 2,
            "turns": 3.0,
            "since_last": 0.8,  # (20 - 12) / 10
            "age": 2.0,  # (20 - 0) / 10
            "mean_gap": 0.6,  # (12 - 0) / 10 / 2 gaps
            "due": 0.8 / 0.6,
        }
    )
    single = dict(zip(FEATURES, x[1], strict=True))
    assert single["turns"] == 1 and single["since_last"] == pytest.approx(0.5)
    assert np.isnan(single["mean_gap"]) and np.isnan(single["due"])
    empty_codes, empty = key_features(kw, 0)
    assert len(empty_codes) == 0 and empty.shape == (0, len(FEATURES))


def test_a_request_in_window_w_does_not_change_its_features() -> None:
    kw, w = hand(), 2
    busier = hand([(21, 1), (22, 2), (29, 2)])  # more requests of seen keys, all in window 2
    codes, x = key_features(kw, w)
    codes_b, x_b = key_features(busier, w)
    assert kw.keys[codes].tolist() == busier.keys[codes_b].tolist()
    np.testing.assert_array_equal(x, x_b)
    assert not np.array_equal(key_features(kw, 3)[1], key_features(busier, 3)[1])
    windows, codes_t, _, y = training_rows(busier, [1, 2])
    assert windows.tolist() == [1, 2, 2] and busier.keys[codes_t].tolist() == [1, 1, 2]
    assert y.tolist() == [1, 1, 2]  # key 2 is first seen in window 1: no row for it there


def _trace(pattern: str, seed: int = 0) -> KeyWindows:
    """20 windows of 60 s. 'every_other': two groups of 30 keys, one requested in even windows,
    the other in odd ones, so a key comes back exactly 2 windows after its last request.
    'three_turns': 15 conversations start each window and have exactly one turn in each of
    their first three windows, then stop. Both get 30 one-off keys per window."""
    rng = np.random.default_rng(seed)
    times, keys = [], []
    for w in range(20):
        if pattern == "every_other":
            active = np.arange(30) + 100 * (w % 2)
        else:
            active = np.concatenate(
                [1000 * s + np.arange(15) for s in range(w - 2, w + 1) if s >= 0]
            )
        one_off = 10**6 + 100 * w + np.arange(30)
        batch = np.concatenate([active, one_off])
        keys.append(batch)
        times.append(w * 60 + rng.uniform(0, 60, len(batch)))
    return KeyWindows.build(np.concatenate([*times, [1230.0]]), np.concatenate([*keys, [-1]]), 60)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["every_other", "three_turns"])
def test_patterns_frequency_misses_are_ranked_better_by_the_features(pattern: str) -> None:
    kw = _trace(pattern)
    ewma = EwmaFrequency(15).fit(kw, 12)
    boost = FeatureBoost(15).fit(kw, 12)
    ewma_recall = mean_metrics(kw, ewma, 15, range(12, 20))[1]
    boost_recall = mean_metrics(kw, boost, 15, range(12, 20))[1]
    assert boost.rounds > 0
    # three_turns: 30 of a window's 75 requests come from keys seen before, so K = 15 recalls
    # at most 0.2; every_other: 30 of 60, at most 0.25
    assert boost_recall > ewma_recall + 0.1


def test_unseen_keys_score_zero_and_seen_keys_positive() -> None:
    kw = _trace("three_turns")
    boost = FeatureBoost(15, **SMALL).fit(kw, 10)
    for w in (10, 15):
        scores = boost.scores(kw, w)
        seen = kw.counts[:w].toarray().sum(0) > 0
        assert (scores[seen] > 0).all() and (scores[~seen] == 0).all()


def test_fit_is_deterministic() -> None:
    kw = _trace("every_other", seed=3)
    a, b = (
        FeatureBoost(15, seed=7, **SMALL).fit(kw, 12),
        FeatureBoost(15, seed=7, **SMALL).fit(kw, 12),
    )
    np.testing.assert_array_equal(a.scores(kw, 15), b.scores(kw, 15))
    assert a.params == b.params


def test_bad_input_raises() -> None:
    kw = hand()
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        key_features(kw, 4)
    with pytest.raises(ValueError, match="alpha"):
        key_features(kw, 1, alphas=(0.0,))
    with pytest.raises(ValueError, match="k >= 1"):
        FeatureBoost(0)
    with pytest.raises(ValueError, match="half-life must be positive"):
        FeatureBoost(2, half_lives=(None, 0.0))
    with pytest.raises(ValueError, match="every 1 window"):
        OnlineRefit(LastWindow, every=0)
    with pytest.raises(RuntimeError, match="fit"):
        OnlineRefit(LastWindow).scores(kw, 1)
    with pytest.raises(ValueError, match="too few"):
        FeatureBoost(2).fit(kw, 2)  # one window with a past: nothing to hold back
    with pytest.raises(ValueError, match="until must be"):
        FeatureBoost(2).fit(kw, 9)
    with pytest.raises(RuntimeError, match="fit"):
        FeatureBoost(2).scores(kw, 1)
    never_back = KeyWindows.build(np.arange(0.0, 100.0), np.arange(100), 10.0)
    with pytest.raises(ValueError, match="no key came back"):
        FeatureBoost(2).fit(never_back, 9)


def _gap_change(n: int = 16, change: int = 8, seed: int = 0) -> KeyWindows:
    """n windows of 60 s. 15 conversations start each window and have 3 turns; a turn in a
    window before `change` is followed by the next 3 windows later, one from `change` on by the
    next 1 window later. Plus 30 one-off keys per window."""
    rng = np.random.default_rng(seed)
    times, keys = [], []
    for s in range(n):
        w = s
        for _ in range(3):
            if w >= n:
                break
            times.append(w * 60 + rng.uniform(0, 60, 15))
            keys.append(1000 * s + np.arange(15))
            w += 3 if w < change else 1
        times.append(s * 60 + rng.uniform(0, 60, 30))
        keys.append(10**6 + 100 * s + np.arange(30))
    end = [n * 60 + 30.0]  # closes the last window
    return KeyWindows.build(np.concatenate([*times, end]), np.concatenate([*keys, [-1]]), 60)


def _append_from(kw: KeyWindows, w: int, seed: int) -> KeyWindows:
    """kw's requests before window w, then arbitrary ones (seen and new keys) from w on."""
    rng = np.random.default_rng(seed)
    b, end = kw.before(w), kw.starts[-1] + kw.window_s
    times = rng.uniform(kw.starts[w], end, 300)
    keys = np.where(rng.random(300) < 0.5, rng.choice(kw.keys, 300), rng.integers(-900, -1, 300))
    return KeyWindows.build(
        np.concatenate([kw.times[:b], times, [end + 1.0]]),
        np.concatenate([kw.keys[kw.codes[:b]], keys, [-1000]]),
        kw.window_s,
    )


def _online(k: int, cache: BoostCache | None = None) -> OnlineRefit:
    return OnlineRefit(lambda: FeatureBoost(k, **SMALL, cache=cache))


@pytest.mark.slow
def test_online_scores_for_w_ignore_every_request_from_w_on() -> None:
    kw, w = _gap_change(), 12
    other = _append_from(kw, w, seed=5)
    a, b = _online(15, BoostCache()).fit(kw, 10), _online(15, BoostCache()).fit(other, 10)
    for v in (11, w):  # refitted on windows < v in both traces: the same requests
        scores_a, scores_b = a.scores(kw, v), b.scores(other, v)
        by_key_a = {int(kw.keys[c]): s for c, s in enumerate(scores_a) if s}
        by_key_b = {int(other.keys[c]): s for c, s in enumerate(scores_b) if s}
        assert by_key_a == pytest.approx(by_key_b, rel=1e-12)
    assert sorted(a.fitted) == sorted(b.fitted) == [10, 11, w]
    a.scores(kw, w + 1)
    b.scores(other, w + 1)
    assert a.fitted[w + 1].params != b.fitted[w + 1].params  # window w differs: so can this


@pytest.mark.slow
def test_online_refits_follow_a_change_the_fit_once_model_cannot() -> None:
    kw = _gap_change()  # conversations return after 3 windows before window 8, after 1 from it
    cache = BoostCache()
    once = FeatureBoost(15, **SMALL, cache=cache).fit(kw, 8)
    online = _online(15, cache).fit(kw, 8)
    windows = range(11, 16)  # the next turn of every returning key came after 1 window
    once_recall = mean_metrics(kw, once, 15, windows)[1]
    online_recall = mean_metrics(kw, online, 15, windows)[1]
    # 30 of a window's 75 requests come back; the 15 keys with two turns, the last one in the
    # window before, each come back once: K = 15 recalls at most 0.2
    assert online_recall > once_recall + 0.1
    assert online_recall > 0.15


@pytest.mark.slow
def test_cached_online_refits_equal_fits_from_scratch() -> None:
    kw = _gap_change()
    online = _online(15, BoostCache()).fit(kw, 10)
    for w in (12, 11, 12):  # out of order and again: each window's own refit
        scratch = FeatureBoost(15, **SMALL).fit(kw, w)  # a fresh, private cache
        np.testing.assert_array_equal(online.scores(kw, w), scratch.scores(kw, w))
        assert online.fitted[w].params == scratch.params
    assert sorted(online.fitted) == [10, 11, 12]


class _Recording:
    """Scores every key with the `until` it was fitted at (so a score names the fit that made
    it) and logs each fit; fitting at `fails_at` raises like a scorer with nothing to fit."""

    def __init__(self, log: list[int], fails_at: int = -1) -> None:
        self.log, self.fails_at, self.until = log, fails_at, -1

    def fit(self, kw: KeyWindows, until: int) -> _Recording:
        if until == self.fails_at:
            raise ValueError("nothing to fit")
        self.log.append(until)
        self.until = until
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        return np.full(kw.n_keys, float(self.until))


def test_online_refits_every_n_windows_and_stands_in_the_last_fit_when_one_fails() -> None:
    kw, log = _trace("every_other"), []
    online = OnlineRefit(lambda: _Recording(log), every=3).fit(kw, 10)
    used = {w: online.scores(kw, w)[0] for w in range(8, 17)}
    assert used == {8: 8, 9: 9, 10: 10, 11: 10, 12: 10, 13: 13, 14: 13, 15: 13, 16: 16}
    assert log == [10, 8, 9, 13, 16]  # each boundary fitted once
    failing = OnlineRefit(lambda: _Recording([], fails_at=13), every=3).fit(kw, 10)
    assert failing.scores(kw, 14)[0] == 10  # the boundary before 13 stands in: windows < 13
    with pytest.raises(ValueError, match="nothing to fit"):
        OnlineRefit(lambda: _Recording([], fails_at=10)).fit(kw, 10)
    with pytest.raises(ValueError, match="fitted on"):
        online.scores(_trace("three_turns"), 12)


def test_preheat_runs_an_online_expert_with_its_online_refits() -> None:
    kw, fixed, online = _trace("every_other"), [], []
    candidates = {
        "fixed": lambda: _Recording(fixed),
        "online": lambda: OnlineRefit(lambda: _Recording(online)),
    }
    model = PreheatHotset(15, candidates, val_windows=3).fit(kw, until=12)
    assert fixed == [9, 12] and online == [9, 12]  # before the held-back windows, and at until
    model.scores(kw, 12)
    # the held-back windows 9..11 warm the weights up: the online expert refits on each one's
    # past, as it does on the evaluated windows
    assert sorted(online) == [9, 10, 11, 12] and fixed == [9, 12]

"""The hot-set combination follows the expert that ranks best, from past windows only."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.hotset import EwmaFrequency, KeyWindows, LastWindow, mean_metrics
from models.forecast.hotset_combination import PreheatHotset

N_WINDOWS, SWITCH = 24, 14


def _two_regimes(seed: int = 0) -> KeyWindows:
    """24 windows of 60 s. Before window 14 a group of 20 keys comes back every window (the last
    window wins); from 14 on, two groups alternate windows (the slow EWMA, which remembers both,
    wins over the last window, which always names the group that just left). 40 one-offs each."""
    rng = np.random.default_rng(seed)
    times, keys = [], []
    for w in range(N_WINDOWS):
        hot = np.arange(20) if w < SWITCH else np.arange(20) + 100 * (1 + w % 2)
        batch = np.concatenate([np.repeat(hot, 3), 10**6 + 100 * w + np.arange(40)])
        keys.append(batch)
        times.append(w * 60 + rng.uniform(0, 60, len(batch)))
    end = N_WINDOWS * 60 + 1.0
    return KeyWindows.build(np.concatenate([*times, [end]]), np.concatenate([*keys, [-1]]), 60)


def _experts() -> dict:
    return {"last_window": LastWindow, "ewma_slow": lambda: EwmaFrequency(40, 0.3, ())}


class _RightUntil:
    """Knows each window's counts (it reads the future: a test expert) before `switch` or from
    it on, and ranks the one-off keys of the last window otherwise: a clear winner per regime."""

    def __init__(self, early: bool) -> None:
        self.early = early

    def fit(self, kw: KeyWindows, until: int) -> _RightUntil:
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if (w < SWITCH) == self.early:
            return kw.row(w)
        return LastWindow().scores(kw, w) * (kw.keys >= 10**6)


def test_the_combination_tracks_the_expert_winning_each_regime() -> None:
    kw = _two_regimes()
    experts = {"early": lambda: _RightUntil(True), "late": lambda: _RightUntil(False)}
    model = PreheatHotset(20, experts, val_windows=4).fit(kw, until=8)
    for half, winner in ((range(8, SWITCH), "early"), (range(SWITCH + 4, N_WINDOWS), "late")):
        recall = model.expert_recall(kw, half)
        assert recall[winner] > max(recall.values()) - 1e-9 and min(recall.values()) < 0.2
        assert mean_metrics(kw, model, 20, half)[1] >= recall[winner] - 0.02
    assert model.weights(kw, SWITCH)[0] > 0.9  # the early expert held the weight
    assert model.weights(kw, SWITCH + 3)[1] > 0.5  # the vote follows the late one from here
    assert model.weights(kw, N_WINDOWS - 1)[1] > 0.9


def test_weights_at_a_window_ignore_it_and_everything_after() -> None:
    kw = _two_regimes()
    times, keys = kw.times.copy(), kw.keys[kw.codes].copy()
    later = kw.window >= 16
    keys[later] = 5 * 10**6 + np.arange(later.sum())  # the future: every request a new key
    changed = KeyWindows.build(np.r_[times, kw.times[-1] + 61], np.r_[keys, [-1]], 60)
    a = PreheatHotset(40, _experts(), val_windows=4).fit(kw, until=8)
    b = PreheatHotset(40, _experts(), val_windows=4).fit(changed, until=8)
    for w in range(8, 17):
        np.testing.assert_array_equal(a.weights(kw, w), b.weights(changed, w))
    assert not np.allclose(a.weights(kw, 20), b.weights(changed, 20))


def test_bad_experts_are_clear_errors() -> None:
    kw = _two_regimes()
    with pytest.raises(ValueError, match="at least one hot-set expert"):
        PreheatHotset(40, {})
    with pytest.raises(ValueError, match="too few before"):
        PreheatHotset(40, _experts(), val_windows=7).fit(kw, until=8)
    with pytest.raises(RuntimeError, match="fit"):
        PreheatHotset(40, _experts()).scores(kw, 9)

    class Broken(LastWindow):
        def fit(self, kw: KeyWindows, until: int) -> Broken:
            raise ValueError("nothing to fit")

    with pytest.raises(ValueError, match="broken left out: nothing to fit"):
        PreheatHotset(40, {"broken": Broken}, val_windows=4).fit(kw, until=8)


def test_with_a_memory_the_weights_learn_from_the_last_windows_only() -> None:
    kw = _two_regimes()
    experts = {"early": lambda: _RightUntil(True), "late": lambda: _RightUntil(False)}
    forgetful = PreheatHotset(20, experts, val_windows=4, memory=3).fit(kw, until=8)
    recent = PreheatHotset(20, experts, val_windows=3).fit(kw, until=SWITCH + 5)
    # three windows after the switch, the weights are those of a combination that began there
    np.testing.assert_array_equal(forgetful.weights(kw, SWITCH + 5), recent.weights(kw, SWITCH + 5))
    remembering = PreheatHotset(20, experts, val_windows=4).fit(kw, until=8)
    assert forgetful.weights(kw, SWITCH + 2)[1] > remembering.weights(kw, SWITCH + 2)[1]
    with pytest.raises(ValueError, match="memory must be at least 1"):
        PreheatHotset(20, experts, memory=0)

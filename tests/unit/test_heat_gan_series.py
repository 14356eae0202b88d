"""Heat series and their windows (issue 5): the decayed-heat recursion, the window scale, the
windows cut from a series, and the train/held-back split that never lets training see the held
back part."""

from __future__ import annotations

import math

import numpy as np
import pytest
from heat_gan_support import L, T
from hypothesis import given, settings
from hypothesis import strategies as st

from models.heat.series import HeatSplit, HeatWindows, decayed_heat, window_scale


def recursion(counts: np.ndarray, keep: float) -> np.ndarray:
    """The heat recursion written out by hand, element by element (no numpy vector maths)."""
    out = np.zeros_like(counts, dtype=np.float64)
    for row in range(counts.shape[0]):
        running = 0.0
        for t in range(counts.shape[1]):
            running = running * keep + float(counts[row, t])
            out[row, t] = running
    return out


def test_decayed_heat_half_life_one_bucket_keeps_half() -> None:
    counts = np.array([[4.0, 0.0, 2.0, 0.0, 0.0], [0.0, 8.0, 0.0, 1.0, 0.0]])
    np.testing.assert_allclose(
        decayed_heat(counts, 1.0),
        [[4.0, 2.0, 3.0, 1.5, 0.75], [0.0, 8.0, 4.0, 3.0, 1.5]],
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=30),
    st.floats(0.1, 50.0),
)
def test_decayed_heat_is_the_recursion(counts: list[int], half_life: float) -> None:
    row = np.array([counts], dtype=np.float64)
    keep = 2.0 ** (-1.0 / half_life)
    np.testing.assert_allclose(decayed_heat(row, half_life), recursion(row, keep), rtol=1e-12)


def test_decayed_heat_half_life_zero_is_the_counts() -> None:
    counts = np.array([[3.0, 0.0, 5.0], [1.0, 1.0, 0.0]])
    out = decayed_heat(counts, 0)
    np.testing.assert_array_equal(out, counts)
    out[0, 0] = 99.0
    assert counts[0, 0] == 3.0  # a copy, not the caller's array


def test_decayed_heat_of_one_series_is_one_row() -> None:
    out = decayed_heat(np.array([2.0, 0.0]), 1.0)
    assert out.shape == (1, 2)
    np.testing.assert_allclose(out, [[2.0, 1.0]])


@pytest.mark.parametrize(
    ("counts", "half_life", "message"),
    [
        ([[1.0, -1.0]], 1.0, "counts must be finite"),
        ([[1.0, math.nan]], 1.0, "counts must be finite"),
        ([[1.0, math.inf]], 1.0, "counts must be finite"),
        ([[1.0, 2.0]], -1.0, "half_life_buckets"),
        ([[1.0, 2.0]], math.nan, "half_life_buckets"),
        ([[1.0, 2.0]], math.inf, "half_life_buckets"),
    ],
)
def test_decayed_heat_rejects_bad_input(
    counts: list[list[float]], half_life: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        decayed_heat(np.array(counts), half_life)


def test_window_scale_is_one_plus_the_mean() -> None:
    np.testing.assert_allclose(window_scale(np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])), [3, 1])


def coded_heat(keys: int, buckets: int) -> np.ndarray:
    """heat[k, t] = 1000 k + t: every value says where it came from."""
    return 1000.0 * np.arange(keys)[:, None] + np.arange(buckets)[None, :]


def test_cut_windows_are_the_right_slices() -> None:
    heat = coded_heat(2, 10)
    windows = HeatWindows.cut(heat, history=3, horizon=2)
    assert len(windows) == 12  # origins 3..8 for each of 2 keys
    assert windows.history.shape == (12, 3) and windows.continuation.shape == (12, 2)
    assert windows.history.dtype == np.float32 and windows.continuation.dtype == np.float32
    # a few by index: the first window, one in the middle, the last
    np.testing.assert_array_equal(windows.history[0], [0, 1, 2])
    np.testing.assert_array_equal(windows.continuation[0], [3, 4])
    assert (windows.rows[0], windows.origins[0]) == (0, 3)
    np.testing.assert_array_equal(windows.history[7], [1001, 1002, 1003])
    np.testing.assert_array_equal(windows.continuation[7], [1004, 1005])
    assert (windows.rows[7], windows.origins[7]) == (1, 4)
    np.testing.assert_array_equal(windows.history[-1], [1005, 1006, 1007])
    np.testing.assert_array_equal(windows.continuation[-1], [1008, 1009])
    # and every one of them
    for i in range(len(windows)):
        row, origin = windows.rows[i], windows.origins[i]
        np.testing.assert_array_equal(windows.history[i], heat[row, origin - 3 : origin])
        np.testing.assert_array_equal(windows.continuation[i], heat[row, origin : origin + 2])


def test_cut_origin_bounds_are_inclusive_and_clamped() -> None:
    heat = coded_heat(2, 10)
    windows = HeatWindows.cut(heat, 3, 2, first=5, last=6)
    assert sorted(set(windows.origins.tolist())) == [5, 6]
    assert len(windows) == 4
    clamped = HeatWindows.cut(heat, 3, 2, first=0, last=100)  # before the history, past the end
    assert clamped.origins.min() == 3 and clamped.origins.max() == 8
    empty = HeatWindows.cut(heat, 3, 2, first=7, last=6)
    assert len(empty) == 0
    assert empty.history.shape == (0, 3) and empty.continuation.shape == (0, 2)
    assert len(HeatWindows.cut(coded_heat(2, 4), 3, 2)) == 0  # too short for any window


def test_cut_rejects_empty_history_or_horizon() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        HeatWindows.cut(coded_heat(1, 10), 0, 2)
    with pytest.raises(ValueError, match="at least 1"):
        HeatWindows.cut(coded_heat(1, 10), 3, 0)


def test_subsample_is_a_sorted_consistent_subset() -> None:
    windows = HeatWindows.cut(coded_heat(3, 30), 4, 2)
    assert windows.subsample(len(windows)) is windows
    picked = windows.subsample(10, seed=1)
    assert len(picked) == 10
    for i in range(10):
        row, origin = picked.rows[i], picked.origins[i]
        assert picked.history[i, -1] == 1000 * row + origin - 1
        assert picked.continuation[i, 0] == 1000 * row + origin
    keys = list(zip(picked.rows.tolist(), picked.origins.tolist(), strict=True))
    assert keys == sorted(keys)
    np.testing.assert_array_equal(windows.subsample(10, seed=1).origins, picked.origins)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(10, 80),
    st.integers(1, 8),
    st.integers(1, 6),
    st.floats(0.05, 0.95),
)
def test_split_never_lets_training_see_the_held_back_part(
    buckets: int, history: int, horizon: int, eval_frac: float
) -> None:
    heat = coded_heat(2, buckets)
    try:
        split = HeatSplit.build(heat, history, horizon, eval_frac)
    except ValueError:
        split_at = round(buckets * (1 - eval_frac))
        assert split_at < history + horizon or buckets - split_at < horizon
        return
    assert len(split.train) > 0 and len(split.held_back) > 0
    assert split.split == round(buckets * (1 - eval_frac))
    # the last bucket of every training continuation is before the split
    assert np.all(split.train.origins + horizon - 1 < split.split)
    assert np.all(split.train.continuation % 1000 < split.split)
    assert split.train.origins.max() == split.split - horizon  # and none is wasted
    assert np.all(split.held_back.origins >= split.split)
    assert np.all(split.held_back.continuation % 1000 >= split.split)
    assert split.held_back.origins.min() == split.split
    assert split.held_back.origins.max() == buckets - horizon


def test_split_rejects_short_series_and_bad_fractions() -> None:
    with pytest.raises(ValueError, match="too few"):
        HeatSplit.build(coded_heat(2, 12), L, T)
    for bad in (0.0, 1.0, -0.2, 1.5, math.nan):
        with pytest.raises(ValueError, match="eval_frac"):
            HeatSplit.build(coded_heat(2, 100), L, T, eval_frac=bad)

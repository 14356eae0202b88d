"""The realism numbers of the heat simulator (issue 5): the naive baseline, the energy score, MMD,
the discriminative score, and the report that compares generators on held-back windows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from heat_gan_support import L, T

from models.heat.gan import HeatGan
from models.heat.realism import (
    NaiveGenerator,
    compare,
    discriminative_score,
    energy_score,
    mmd_rbf,
)
from models.heat.series import HeatSplit, HeatWindows


def test_naive_generator_repeats_the_last_window() -> None:
    train = HeatWindows.cut(np.full((3, 40), 4.0), L, T)
    naive = NaiveGenerator.fit(train)
    assert naive.sigma == 0.0 and naive.horizon == T
    history = np.array([[1.0, 2, 3, 4, 5, 6, 7], [0, 0, 0, 9, 0, 0, 8]])
    out = naive.sample(history, 3, seed=1)
    assert out.shape == (2, 3, T)
    np.testing.assert_array_equal(out, np.repeat(history[:, None, -T:], 3, axis=1))


def test_naive_generator_cycles_a_short_history() -> None:
    naive = NaiveGenerator(horizon=5, sigma=0.0)
    np.testing.assert_array_equal(naive.sample(np.array([[1.0, 2.0]]), 1)[0, 0], [1, 2, 1, 2, 1])


def test_naive_sigma_is_robust_to_one_outlier_window() -> None:
    rng = np.random.default_rng(0)
    history = np.full((400, L), 9.0)  # scale 10
    continuation = (9.0 + rng.normal(0, 1.0, (400, T))).astype(np.float32)  # error sd 0.1 scaled
    rows, origins = np.zeros(400, np.int64), np.arange(400)
    clean = NaiveGenerator.fit(HeatWindows(history, continuation, rows, origins))
    spoiled = continuation.copy()
    spoiled[0] = 1e6  # a gap in the trace: history ~ flat, continuation huge
    dirty = NaiveGenerator.fit(HeatWindows(history, spoiled, rows, origins))
    assert clean.sigma == pytest.approx(0.1, rel=0.15)
    assert dirty.sigma == pytest.approx(clean.sigma, rel=0.05)
    assert np.std((continuation.ravel() - 9.0) / 10) < 0.2  # while a plain sd is not:
    assert np.std((spoiled.ravel() - 9.0) / 10) > 100


def test_naive_noise_scales_with_the_window_and_is_clipped() -> None:
    naive = NaiveGenerator(horizon=T, sigma=0.5)
    out = naive.sample(np.zeros((4, L)), 200, seed=0)
    assert np.all(out >= 0) and np.any(out == 0)  # the noise on a zero level, clipped
    busy = naive.sample(np.full((1, L), 99.0), 2000, seed=0)
    assert busy.std() == pytest.approx(0.5 * 100, rel=0.05)
    np.testing.assert_array_equal(out, naive.sample(np.zeros((4, L)), 200, seed=0))


def test_numpy_energy_score() -> None:
    rng = np.random.default_rng(0)
    real = rng.normal(size=(50, T))
    perfect = np.repeat(real[:, None, :], 8, axis=1)
    assert energy_score(perfect, real) == pytest.approx(0.0, abs=1e-12)
    assert energy_score(perfect + 1.0, real) == pytest.approx(math.sqrt(T))  # 1 in each bucket
    honest = real[:, None, :] + rng.normal(size=(50, 32, T))
    biased = honest + 2.0
    assert energy_score(honest, real) < energy_score(biased, real)
    # two paths: E|X - y| - 1/2 |X - X'|, by hand
    two = np.array([[[3.0, 4.0], [0.0, 0.0]]])
    assert energy_score(two, np.zeros((1, 2))) == pytest.approx(2.5 - 2.5)


def test_mmd_separates_shifted_samples() -> None:
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(200, 5)), rng.normal(size=(200, 5))
    same = mmd_rbf(first, second)
    shifted = mmd_rbf(first, second + 1.5)
    assert abs(same) < 0.01
    assert shifted > 0.1
    assert shifted > 10 * abs(same)


def test_mmd_by_hand() -> None:
    """{0, 1} against itself: the median squared distance of the four points is 1, so
    k(0, 1) = e^-1 and the unbiased MMD^2 = e^-1 + e^-1 - 2 (1 + e^-1) / 2 = e^-1 - 1."""
    points = np.array([[0.0], [1.0]])
    assert mmd_rbf(points, points) == pytest.approx(math.exp(-1) - 1)


def test_discriminative_score() -> None:
    rng = np.random.default_rng(0)
    real = rng.normal(size=(200, 5))
    assert discriminative_score(real, rng.normal(size=(200, 5))) < 0.12
    assert discriminative_score(real, rng.normal(size=(200, 5)) + 5) > 0.45


def toy_windows(count: int, seed: int = 0) -> HeatWindows:
    """The truth: the next buckets are the last one plus N(0, 1) noise."""
    rng = np.random.default_rng(seed)
    history = rng.uniform(5, 15, (count, L))
    continuation = history[:, -1:] + rng.normal(0, 1, (count, T))
    return HeatWindows(
        history.astype(np.float32),
        continuation.astype(np.float32),
        np.zeros(count, np.int64),
        np.arange(count),
    )


def truth(history: np.ndarray, paths: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 100)
    return history[:, -1][:, None, None] + rng.normal(0, 1, (len(history), paths, T))


def wrong(history: np.ndarray, paths: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 0.3 * history[:, -1][:, None, None] + rng.normal(0, 3, (len(history), paths, T))


def test_compare_ranks_the_true_process_first() -> None:
    held = toy_windows(150)
    report = compare({"truth": truth, "wrong": wrong}, held, paths=8, max_pairs=120)
    assert report["windows"] == 120 and report["paths"] == 8
    assert set(report["generators"]) == {"truth", "wrong"}
    for numbers in report["generators"].values():
        assert set(numbers) == {"energy_score", "mmd", "discriminative", "autocorrelation_gap"}
        assert all(math.isfinite(v) for v in numbers.values())
    good, bad = report["generators"]["truth"], report["generators"]["wrong"]
    assert good["energy_score"] < bad["energy_score"]
    assert good["mmd"] < bad["mmd"]
    assert good["discriminative"] < bad["discriminative"]


def test_compare_with_the_trained_gan_and_the_naive_baseline(
    model: HeatGan, split: HeatSplit
) -> None:
    naive = NaiveGenerator.fit(split.train)
    report = compare({"gan": model.sample, "naive": naive.sample}, split.held_back, paths=8)
    assert report["windows"] == len(split.held_back)
    for numbers in report["generators"].values():
        assert numbers["energy_score"] >= 0 and 0 <= numbers["discriminative"] <= 0.5


def test_compare_works_for_a_short_history() -> None:
    """GanConfig accepts any history >= 1, so the realism report must measure it too."""
    heat = np.random.default_rng(0).uniform(1, 5, (3, 40))
    held = HeatWindows.cut(heat, history=2, horizon=3)

    def repeat(history: np.ndarray, paths: int, seed: int) -> np.ndarray:
        return np.repeat(history[:, None, -1:], paths, axis=1).repeat(3, axis=2)

    report = compare({"repeat": repeat}, held, paths=4)
    assert all(math.isfinite(v) for v in report["generators"]["repeat"].values())


def test_compare_rejects_too_few_windows_or_paths() -> None:
    with pytest.raises(ValueError, match="too few"):
        compare({"truth": truth}, toy_windows(9))
    with pytest.raises(ValueError, match="paths"):
        compare({"truth": truth}, toy_windows(50), paths=3)

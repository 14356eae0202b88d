"""The heat-evolution simulator (issue 5): heat series and windows, the LSTM-GAN, its realism
numbers and the counterfactual rollout. One tiny GAN is trained per module and reused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.heat.gan import (
    GanConfig,
    Generator,
    HeatGan,
    load_gan,
    save_gan,
    train_gan,
)
from models.heat.gan import energy_score as torch_energy_score
from models.heat.realism import (
    NaiveGenerator,
    compare,
    discriminative_score,
    energy_score,
    mmd_rbf,
)
from models.heat.series import HeatSplit, HeatWindows, decayed_heat, window_scale
from models.heat.simulate import Event, Simulation, sensitivity, simulate, simulation_figure

torch.set_num_threads(1)

L, T = 7, 6
TINY = GanConfig(hidden=16, noise_dim=8, mlp_hidden=16, epochs=15, batch_size=64)
KEYS = ["hot-a", "hot-b", "warm", "quiet", "cold"]


def sawtooth_heat(keys: int = 8, buckets: int = 120, period: int = 5) -> np.ndarray:
    """(K, N) decayed heat of keys that burst every `period` buckets (phase and size per key):
    a deterministic pattern an LSTM can learn from its last 7 buckets."""
    counts = np.zeros((keys, buckets))
    for k in range(keys):
        counts[k, (np.arange(buckets) + k) % period == 0] = 5.0 + 3.0 * k
    return decayed_heat(counts, TINY.half_life_buckets)


def recursion(counts: np.ndarray, keep: float) -> np.ndarray:
    """The heat recursion written out by hand, element by element (no numpy vector maths)."""
    out = np.zeros_like(counts, dtype=np.float64)
    for row in range(counts.shape[0]):
        running = 0.0
        for t in range(counts.shape[1]):
            running = running * keep + float(counts[row, t])
            out[row, t] = running
    return out


def normalised_energy(samples: np.ndarray, windows: HeatWindows) -> float:
    scale = window_scale(windows.history)
    return energy_score(samples / scale[:, None, None], windows.continuation / scale[:, None])


@pytest.fixture(scope="module")
def split() -> HeatSplit:
    return HeatSplit.build(sawtooth_heat(), L, T)


@pytest.fixture(scope="module")
def model(split: HeatSplit) -> HeatGan:
    return train_gan(split.train, TINY)


@pytest.fixture(scope="module")
def sim_history() -> np.ndarray:
    """(5, 10) heat in requests: two hot keys, a warm one, a quiet one and a cold (all-zero) one."""
    rng = np.random.default_rng(7)
    levels = np.array([80.0, 60.0, 20.0, 3.0, 0.0])
    return levels[:, None] * rng.uniform(0.7, 1.3, (len(levels), 10))


# --- series ------------------------------------------------------------------------------------


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


# --- gan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"history": 0},
        {"horizon": 0},
        {"hidden": 0},
        {"noise_dim": 0},
        {"mlp_hidden": 0},
        {"batch_size": 0},
        {"epochs": -1},
        {"adversarial_weight": -0.1},
        {"energy_weight": -1.0},
        {"half_life_buckets": -1.0},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GanConfig(**bad)


def test_generator_output_shape() -> None:
    torch.manual_seed(0)
    out = Generator(TINY)(torch.rand(5, L) * 10, torch.randn(5, TINY.noise_dim))
    assert out.shape == (5, T)


def fixed_arrivals(config: GanConfig, value: float) -> Generator:
    """A generator whose MLP outputs `value` for every bucket whatever its input."""
    torch.manual_seed(0)
    generator = Generator(config)
    with torch.no_grad():
        generator.mlp[-1].weight.zero_()
        generator.mlp[-1].bias.fill_(value)
    return generator


@pytest.mark.parametrize("half_life", [1.0, 2.0, 0.0])
def test_a_quiet_key_decays_exactly_like_heat(half_life: float) -> None:
    config = GanConfig(hidden=16, noise_dim=8, mlp_hidden=16, half_life_buckets=half_life)
    generator = fixed_arrivals(config, -1e3)  # ReLU: no arrivals at all
    counts = np.array([[3, 0, 9, 1, 0, 0, 4, 2, 0, 5], [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]], float)
    history = decayed_heat(counts, half_life)[:, -L:]
    with torch.no_grad():
        out = generator(torch.as_tensor(history, dtype=torch.float32), torch.randn(2, 8)).numpy()
    keep = 0.0 if half_life == 0 else 2.0 ** (-1.0 / half_life)
    expected = history[:, -1:] * keep ** (np.arange(T) + 1)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # ... which is what the series would be with no more requests
    silent = decayed_heat(np.concatenate([counts, np.zeros((2, T))], axis=1), half_life)
    np.testing.assert_allclose(out, silent[:, -T:], rtol=1e-5, atol=1e-6)
    if half_life == 1.0:
        np.testing.assert_allclose(out[1], [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625])


@pytest.mark.parametrize("half_life", [1.0, 3.0, 0.0])
def test_arrivals_accumulate_like_heat(half_life: float) -> None:
    """Constant arrivals c (in window-scale units) are c x scale requests per bucket, carried
    forward by the same recursion: the continuation is the heat of those counts."""
    config = GanConfig(hidden=16, noise_dim=8, mlp_hidden=16, half_life_buckets=half_life)
    generator = fixed_arrivals(config, 0.5)
    counts = np.array([[2, 0, 0, 7, 1, 0, 3, 0, 0, 2]], float)
    history = decayed_heat(counts, half_life)[:, -L:]
    with torch.no_grad():
        out = generator(torch.as_tensor(history, dtype=torch.float32), torch.randn(1, 8)).numpy()
    future = np.full((1, T), 0.5 * window_scale(history)[0])
    expected = decayed_heat(np.concatenate([counts, future], axis=1), half_life)[:, -T:]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_sample_shapes_seeds_and_sign(model: HeatGan, split: HeatSplit) -> None:
    history = split.held_back.history[:9]
    paths = model.sample(history, 5, seed=3)
    assert paths.shape == (9, 5, T)
    assert np.all(paths >= 0) and np.all(np.isfinite(paths))
    np.testing.assert_array_equal(paths, model.sample(history, 5, seed=3))
    assert not np.array_equal(paths, model.sample(history, 5, seed=4))
    assert paths.std(axis=1).max() > 0  # the noise does something
    assert not model.training


@pytest.mark.parametrize("shape", [(L,), (4, L - 1), (4, L + 1), (2, 3, L)])
def test_sample_rejects_bad_history_shapes(model: HeatGan, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="history must be"):
        model.sample(np.ones(shape), 2)


def test_torch_energy_score_by_hand() -> None:
    real = torch.zeros(1, 2)
    step = torch.tensor([[3.0, 4.0]])  # |step| = 5
    assert float(torch_energy_score(real, real, real)) == 0.0
    assert float(torch_energy_score(step, step, real)) == pytest.approx(5.0)  # 5 - 0
    assert float(torch_energy_score(step, real, real)) == pytest.approx(0.0)  # 2.5 - 2.5
    assert float(torch_energy_score(2 * step, -step, real)) == pytest.approx(0.0)  # 7.5 - 7.5
    batch = torch_energy_score(torch.cat([step, real]), torch.cat([step, real]), torch.zeros(2, 2))
    assert float(batch) == pytest.approx(2.5)  # the mean over the batch


def test_torch_energy_score_prefers_samples_centred_on_the_truth() -> None:
    gen = torch.Generator().manual_seed(0)
    real = torch.randn(256, T, generator=gen) * 3
    centred = [real + torch.randn(256, T, generator=gen) for _ in range(2)]
    shifted = [real + 2 + torch.randn(256, T, generator=gen) for _ in range(2)]
    assert float(torch_energy_score(*centred, real)) < float(torch_energy_score(*shifted, real))


def test_training_lowers_the_energy_score(model: HeatGan, split: HeatSplit) -> None:
    torch.manual_seed(TINY.seed)
    untrained = HeatGan(TINY).eval()  # the same initial weights train_gan started from
    held = split.held_back
    before = normalised_energy(untrained.sample(held.history, 16, seed=1), held)
    after = normalised_energy(model.sample(held.history, 16, seed=1), held)
    assert after < 0.8 * before, (before, after)


def test_training_is_deterministic(split: HeatSplit) -> None:
    config = GanConfig(hidden=8, noise_dim=4, mlp_hidden=8, epochs=2, batch_size=64, seed=5)
    first, second = train_gan(split.train, config), train_gan(split.train, config)
    history = split.held_back.history[:4]
    np.testing.assert_array_equal(first.sample(history, 3), second.sample(history, 3))


def test_save_and_load_round_trip(model: HeatGan, split: HeatSplit, tmp_path: Path) -> None:
    path = tmp_path / "nested" / "gan.pt"
    save_gan(model, path, extra={"version": 3, "keys": ["a", "b"]})
    loaded, extra = load_gan(path)
    assert extra == {"version": 3, "keys": ["a", "b"]}
    assert loaded.config == model.config
    assert not loaded.training
    history = split.held_back.history[:6]
    np.testing.assert_array_equal(
        loaded.sample(history, 4, seed=2), model.sample(history, 4, seed=2)
    )
    save_gan(model, tmp_path / "bare.pt")
    assert load_gan(tmp_path / "bare.pt")[1] == {}


def test_train_gan_rejects_empty_or_misshapen_windows() -> None:
    with pytest.raises(ValueError, match="no training windows"):
        train_gan(HeatWindows.cut(np.ones((2, 5)), L, T), TINY)
    with pytest.raises(ValueError, match="shapes"):
        train_gan(HeatWindows.cut(np.ones((2, 30)), L - 1, T), TINY)


# --- realism -----------------------------------------------------------------------------------


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


# --- simulate ----------------------------------------------------------------------------------


def test_event_parse() -> None:
    assert Event.parse("3:template:abc:0.3") == Event(3, "template:abc", 0.3)
    assert Event.parse("0:k:-1.5") == Event(0, "k", -1.5)
    assert Event.parse("12:a:b:c:2") == Event(12, "a:b:c", 2.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3:abc", "expected AT:KEY:DELTA"),
        ("nothing", "expected AT:KEY:DELTA"),
        ("3::0.3", "expected AT:KEY:DELTA"),
        ("", "expected AT:KEY:DELTA"),
        ("x:key:0.3", "'x:key:0.3'"),
        ("3:key:lots", "'3:key:lots'"),
        ("1.5:key:0.3", "'1.5:key:0.3'"),
        ("-1:key:0.3", ">= 0 buckets ahead"),
        ("3:key:nan", "finite"),
        ("3:key:inf", "finite"),
    ],
)
def test_event_parse_rejects_malformed_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Event.parse(text)


def test_event_rejects_negative_time_and_infinite_delta() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Event(-1, "k", 0.3)
    with pytest.raises(ValueError, match="finite"):
        Event(0, "k", math.inf)


def test_simulate_without_events_is_the_baseline(model: HeatGan, sim_history: np.ndarray) -> None:
    result = simulate(model, sim_history, KEYS, n_paths=12)
    assert isinstance(result, Simulation)
    assert result.baseline.shape == (len(KEYS), 12, T)
    np.testing.assert_array_equal(result.counterfactual, result.baseline)
    assert np.all(result.baseline >= 0)
    summary = result.summary
    assert summary["entered"] == [] and summary["left"] == [] and summary["jaccard"] == 1.0
    assert summary["baseline_top"] == summary["counterfactual_top"]
    assert summary["top_k"] == len(KEYS)  # top_k 10 > 5 keys
    again = simulate(model, sim_history, KEYS, n_paths=12)
    np.testing.assert_array_equal(again.baseline, result.baseline)
    other = simulate(model, sim_history, KEYS, n_paths=12, seed=1)
    assert not np.array_equal(other.baseline, result.baseline)


def test_an_event_bumps_its_key_and_nothing_else(model: HeatGan, sim_history: np.ndarray) -> None:
    delta = 0.3
    result = simulate(model, sim_history, KEYS, n_paths=16, events=[Event(0, "warm", delta)])
    row = KEYS.index("warm")
    peak = max(sim_history[row].max(), 1.0)
    np.testing.assert_array_equal(
        result.counterfactual[row, :, 0], result.baseline[row, :, 0] + delta * peak
    )
    others = [i for i in range(len(KEYS)) if i != row]
    np.testing.assert_array_equal(result.counterfactual[others], result.baseline[others])
    assert not np.array_equal(result.counterfactual[row, :, 1:], result.baseline[row, :, 1:])
    numbers = result.summary["keys"]["warm"]
    assert numbers["expected_heat_after"] > numbers["expected_heat_before"]
    assert numbers["expected_heat_after"] - numbers["expected_heat_before"] >= 0.99 * delta * peak


def test_an_event_later_on_leaves_the_buckets_before_it(
    model: HeatGan, sim_history: np.ndarray
) -> None:
    result = simulate(model, sim_history, KEYS, n_paths=8, events=[Event(2, "quiet", 4.0)])
    row = KEYS.index("quiet")
    peak = max(sim_history[row].max(), 1.0)
    np.testing.assert_array_equal(result.counterfactual[:, :, :2], result.baseline[:, :, :2])
    np.testing.assert_array_equal(
        result.counterfactual[row, :, 2], result.baseline[row, :, 2] + 4.0 * peak
    )


def test_a_big_event_on_a_cold_key_puts_it_in_the_plan(
    model: HeatGan, sim_history: np.ndarray
) -> None:
    assert sim_history[KEYS.index("cold")].max() == 0.0  # its peak counts as one request
    result = simulate(model, sim_history, KEYS, n_paths=16, top_k=2, events=[Event(0, "cold", 1e4)])
    row = KEYS.index("cold")
    np.testing.assert_array_equal(
        result.counterfactual[row, :, 0], result.baseline[row, :, 0] + 1e4
    )
    summary = result.summary
    assert summary["top_k"] == 2
    assert summary["baseline_top"] == ["hot-a", "hot-b"]
    assert summary["entered"] == ["cold"]
    assert summary["counterfactual_top"][0] == "cold"
    assert summary["left"] == ["hot-b"]
    assert summary["jaccard"] == pytest.approx(1 / 3, abs=1e-4)
    cold = summary["keys"]["cold"]
    assert cold["rank_after"] == 1 < cold["rank_before"]
    assert cold["share_of_paths_in_top_k_after"] == 1.0
    assert cold["share_of_paths_in_top_k_before"] == 0.0
    assert set(summary["keys"]) == {"cold", "hot-b"}  # the event's key and those that moved


def test_a_negative_event_never_makes_heat_negative(
    model: HeatGan, sim_history: np.ndarray
) -> None:
    events = [Event(0, "hot-a", -5.0), Event(3, "quiet", -0.5)]
    result = simulate(model, sim_history, KEYS, n_paths=16, horizon=10, events=events)
    assert np.all(result.counterfactual >= 0)
    row = KEYS.index("hot-a")
    np.testing.assert_array_equal(result.counterfactual[row, :, 0], 0.0)
    numbers = result.summary["keys"]["hot-a"]
    assert numbers["expected_heat_after"] < numbers["expected_heat_before"]


def test_sensitivity_by_hand() -> None:
    """Three keys, two one-bucket paths: path totals (3, 2, 1) and (1, 2, 3). All tie on
    expected heat (2), so the stable order puts the first key on top."""
    baseline = np.array([[[3.0], [1.0]], [[2.0], [2.0]], [[1.0], [3.0]]])  # (K=3, P=2, H=1)
    counterfactual = baseline.copy()
    counterfactual[2] += 1.0  # key c: totals (2, 4), expected 3
    keys = ["a", "b", "c"]
    events = [Event(0, key, 0.0) for key in keys]  # watch every key
    out = sensitivity(keys, baseline, counterfactual, top_k=1, events=events)
    assert out["top_k"] == 1
    assert out["baseline_top"] == ["a"] and out["counterfactual_top"] == ["c"]
    assert out["entered"] == ["c"] and out["left"] == ["a"] and out["jaccard"] == 0.0
    shares_before = [out["keys"][k]["share_of_paths_in_top_k_before"] for k in keys]
    shares_after = [out["keys"][k]["share_of_paths_in_top_k_after"] for k in keys]
    assert shares_before == [0.5, 0.0, 0.5]  # a tops path 0, c tops path 1
    assert shares_after == [0.5, 0.0, 0.5]  # path 0: a (3) beats c (2); path 1: c (4)
    assert [out["keys"][k]["rank_before"] for k in keys] == [1, 2, 3]
    assert [out["keys"][k]["rank_after"] for k in keys] == [2, 3, 1]
    assert out["keys"]["c"]["expected_heat_after"] == 3.0
    big = sensitivity(keys, baseline, baseline, top_k=5, events=[])
    assert big["top_k"] == 3 and big["keys"] == {} and big["jaccard"] == 1.0


def test_events_at_one_bucket_add_up(model: HeatGan, sim_history: np.ndarray) -> None:
    twice = [Event(1, "warm", 0.2), Event(1, "warm", 0.3)]
    once = [Event(1, "warm", 0.5)]
    a = simulate(model, sim_history, KEYS, n_paths=8, events=twice)
    b = simulate(model, sim_history, KEYS, n_paths=8, events=once)
    np.testing.assert_allclose(a.counterfactual, b.counterfactual, rtol=1e-12)


def test_a_long_horizon_is_rolled_out_in_chunks(model: HeatGan, sim_history: np.ndarray) -> None:
    long = simulate(model, sim_history, KEYS, n_paths=8, horizon=3 * T + 2)
    assert long.baseline.shape == (len(KEYS), 8, 3 * T + 2)
    assert np.all(long.baseline >= 0) and np.all(np.isfinite(long.baseline))
    short = simulate(model, sim_history, KEYS, n_paths=8)
    np.testing.assert_array_equal(long.baseline[:, :, :T], short.baseline)  # the first chunk
    late = simulate(model, sim_history, KEYS, n_paths=8, horizon=3 * T + 2, events=[
        Event(2 * T + 1, "quiet", 2.0)
    ])  # fmt: skip
    assert late.counterfactual.shape == (len(KEYS), 8, 3 * T + 2)
    np.testing.assert_array_equal(
        late.counterfactual[:, :, : 2 * T + 1], late.baseline[:, :, : 2 * T + 1]
    )
    assert not np.array_equal(late.counterfactual, late.baseline)


def test_simulate_uses_the_last_history_buckets(model: HeatGan, sim_history: np.ndarray) -> None:
    longer = np.concatenate([np.full((len(KEYS), 5), 0.5), sim_history], axis=1)
    a = simulate(model, longer, KEYS, n_paths=4)
    b = simulate(model, sim_history[:, -L:], KEYS, n_paths=4)
    np.testing.assert_array_equal(a.baseline, b.baseline)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"events": [Event(0, "nobody", 1.0)]}, "simulated keys"),
        ({"events": [Event(T, "warm", 1.0)]}, "past the horizon"),
        ({"history": "short"}, "the model needs"),
        ({"history": "nan"}, "finite"),
        ({"history": "negative"}, "finite"),
        ({"keys": ["a", "a", "b", "c", "d"]}, "unique"),
        ({"keys": KEYS[:4]}, "one row per key"),
        ({"n_paths": 0}, "at least 1"),
        ({"top_k": 0}, "at least 1"),
        ({"horizon": -2}, "at least 1"),
    ],
)
def test_simulate_rejects_bad_input(
    model: HeatGan, sim_history: np.ndarray, change: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"history": sim_history, "keys": KEYS, "n_paths": 4}
    args.update(change)
    history = sim_history.copy()
    if change.get("history") == "short":
        args["history"] = history[:, : L - 1]
    elif change.get("history") == "nan":
        history[1, 3] = math.nan
        args["history"] = history
    elif change.get("history") == "negative":
        history[1, 3] = -1.0
        args["history"] = history
    with pytest.raises(ValueError, match=message):
        simulate(model, **args)  # type: ignore[arg-type]


def test_simulate_rejects_a_zero_horizon(model: HeatGan, sim_history: np.ndarray) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        simulate(model, sim_history, KEYS, n_paths=4, horizon=0)


def test_event_time_must_be_whole() -> None:
    with pytest.raises(ValueError, match="whole number"):
        Event(1.5, "k", 1.0)  # type: ignore[arg-type]


def test_simulation_figure(model: HeatGan, sim_history: np.ndarray, tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    events = [Event(0, "cold", 5.0), Event(1, "warm", 0.5), Event(2, "cold", 1.0)]
    result = simulate(model, sim_history, KEYS, n_paths=8, events=events)
    figure = simulation_figure(result)
    assert isinstance(figure, Figure)
    assert [ax.get_title() for ax in figure.axes] == ["cold", "warm"]  # one per event key
    figure.savefig(tmp_path / "sim.png")
    assert (tmp_path / "sim.png").stat().st_size > 0
    plain = simulation_figure(simulate(model, sim_history, KEYS, n_paths=8, top_k=3))
    assert [ax.get_title() for ax in plain.axes] == ["hot-a", "hot-b", "warm"]
    chosen = simulation_figure(result, keys=["quiet"])
    assert [ax.get_title() for ax in chosen.axes] == ["quiet"]

"""The heat-evolution simulator's LSTM-GAN (issue 5): its configuration, the generator's heat
recursion, sampling, the energy score it trains on, training and saving. The tiny GAN trained
once for the session is the conftest's `model`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from heat_gan_support import TINY, L, T

from models.heat.gan import (
    GanConfig,
    Generator,
    HeatGan,
    load_gan,
    save_gan,
    train_gan,
)
from models.heat.gan import energy_score as torch_energy_score
from models.heat.realism import energy_score
from models.heat.series import HeatSplit, HeatWindows, decayed_heat, window_scale


def normalised_energy(samples: np.ndarray, windows: HeatWindows) -> float:
    scale = window_scale(windows.history)
    return energy_score(samples / scale[:, None, None], windows.continuation / scale[:, None])


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

"""The attention forecaster: shapes, masks, gate, no look-ahead, checkpoints, and that it learns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.forecast.attention import (
    AttentionConfig,
    AttentionForecaster,
    DrawnSamples,
    MultiScaleAttention,
    WindowSource,
    _tensors,
    load_checkpoint,
    multiscale_windows,
    predict,
    save_checkpoint,
    train_module,
)

SMALL = AttentionConfig(scales=(1, 2, 4), context=4, horizon=2, d_model=8, heads=2, hidden=16)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_windows_are_span_means_of_the_past_only() -> None:
    series = np.arange(1.0, 21.0)  # 1..20
    windows = multiscale_windows(series, np.array([0]), np.array([10]), SMALL)
    level = windows.level[0]
    # base scale: the last 4 buckets before origin 10 are series[6:10] = 7, 8, 9, 10
    np.testing.assert_allclose(windows.tokens[0, 0] * level, [7, 8, 9, 10])
    # scale 2: spans [2,4) [4,6) [6,8) [8,10) -> means 3.5, 5.5, 7.5, 9.5
    np.testing.assert_allclose(windows.tokens[0, 1] * level, [3.5, 5.5, 7.5, 9.5])
    # scale 4: spans [-6,-2) and [-2,2) reach before the series and are masked; [2,6) [6,10) not
    np.testing.assert_array_equal(windows.mask[0, 2], [False, False, True, True])
    np.testing.assert_allclose(windows.tokens[0, 2, 2:] * level, [4.5, 8.5])
    assert windows.last[0] == 10 and level == pytest.approx(8.5)


def test_windows_ignore_everything_from_the_origin_on() -> None:
    rng = np.random.default_rng(1)
    series = rng.poisson(4, size=60).astype(float)
    origins = np.array([5, 17, 40])
    before = multiscale_windows(series, np.zeros(3, int), origins, SMALL)
    for origin in origins:
        poisoned = series.copy()
        poisoned[origin:] = 1e9
        after = multiscale_windows(poisoned, np.zeros(1, int), np.array([origin]), SMALL)
        row = int(np.flatnonzero(origins == origin)[0])
        np.testing.assert_array_equal(after.tokens[0], before.tokens[row])
        assert after.last[0] == before.last[row] and after.level[0] == before.level[row]


def test_training_samples_built_when_drawn_are_the_samples_built_up_front() -> None:
    """A batch of `DrawnSamples` is the same tensors, in the same order, as the same indices of
    every sample's window built at once (what training held in memory before)."""
    rng = np.random.default_rng(2)
    series = rng.poisson(4, size=(3, 50)).astype(float)
    origins = np.tile(np.arange(1, 49), 3)  # (N,)
    rows = np.repeat(np.arange(3), 48)  # (N,)
    drawn = DrawnSamples(WindowSource(series, SMALL), rows, origins)
    everything = multiscale_windows(series, rows, origins, SMALL)
    offsets = origins[:, None] + np.arange(SMALL.horizon)[None, :]  # (N, H)
    targets = series[rows[:, None], offsets] / everything.level[:, None]
    up_front = (*_tensors(everything), torch.as_tensor(targets, dtype=torch.float32))
    assert len(drawn) == 144
    for indices in ([0], [143, 5, 5, 70], list(range(0, 144, 7))):
        for built, whole in zip(drawn.__getitems__(indices), up_front, strict=True):
            assert torch.equal(built, whole[indices])


def test_origin_without_history_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one past bucket"):
        multiscale_windows(np.ones(10), np.array([0]), np.array([0]), SMALL)
    # in training too, before any batch draws it (an epoch may never draw the bad one)
    origins = np.arange(0, 7)
    with pytest.raises(ValueError, match="at least one past bucket"):
        train_module(np.ones((1, 10)), np.zeros(7, int), origins, replace(SMALL, epochs=1))
    with pytest.raises(ValueError, match="row is not one of"):
        DrawnSamples(WindowSource(np.ones((1, 10)), SMALL), np.array([1]), np.array([3]))


def test_forward_shapes_and_gate_drops_scales_with_no_past() -> None:
    net = MultiScaleAttention(SMALL)
    windows = multiscale_windows(np.ones((3, 30)), np.array([0, 1, 2]), np.array([1, 3, 29]), SMALL)
    tokens = torch.as_tensor(windows.tokens, dtype=torch.float32)  # (B=3, S=3, L=4)
    mask = torch.as_tensor(windows.mask)
    point = torch.zeros(3, 3)
    out = net(tokens, mask, point)
    assert out.shape == (3, SMALL.horizon) and torch.isfinite(out).all()
    gate = net.gate_weights(tokens, mask)  # (B, S)
    torch.testing.assert_close(gate.sum(1), torch.ones(3))
    # origin 1: scales 2 and 4 have no complete span in the past, so they get no weight
    assert gate[0, 1] == 0 and gate[0, 2] == 0 and gate[0, 0] == 1
    assert (gate[2] > 0).all()


def test_padding_does_not_change_the_encoding() -> None:
    """Masked tokens must not leak into the pooled vector, whatever value they hold."""
    net = MultiScaleAttention(SMALL).eval()
    tokens = torch.rand(2, 3, 4)
    mask = torch.tensor([[True] * 4, [False] + [True] * 3, [False] * 2 + [True] * 2])
    mask = mask[None].expand(2, 3, 4).clone()
    changed = tokens.clone()
    changed[~mask] = 1e6
    torch.testing.assert_close(net.encode(tokens, mask), net.encode(changed, mask))


def test_forecasts_are_non_negative_and_forecaster_checks_horizon() -> None:
    series = np.r_[np.full(40, 50.0), np.zeros(40)]  # a collapse pushes deltas below zero
    model = AttentionForecaster(AttentionConfig(**{**SMALL.__dict__, "epochs": 2})).fit(series)
    out = model.forecast(series, np.arange(41, 78), 2)
    assert out.shape == (37, 2) and (out >= 0).all()
    with pytest.raises(ValueError, match="horizon"):
        model.forecast(series, np.array([50]), 3)


def test_it_learns_a_pattern_the_naive_forecast_cannot() -> None:
    """Minimum function: an alternating series; last-value is wrong by 10 on every other step."""
    series = np.tile([0.0, 10.0], 150)
    config = AttentionConfig(**{**SMALL.__dict__, "epochs": 30, "dropout": 0.0, "lr": 3e-3})
    model = AttentionForecaster(config).fit(series[:240])
    origins = np.arange(240, 298)
    targets = series[origins[:, None] + np.arange(2)]
    model_mae = np.abs(model.forecast(series, origins, 2) - targets).mean()
    naive_mae = np.abs(series[origins - 1][:, None] - targets).mean()
    assert naive_mae == 5.0
    assert model_mae < 2.0


def test_too_short_a_series_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="needs at least 8"):
        AttentionForecaster(SMALL).fit(np.ones(6))


def test_checkpoint_rebuilds_the_same_model(tmp_path: Path) -> None:
    series = np.random.default_rng(2).poisson(3, size=(4, 30)).astype(float)
    rows, origins = np.repeat(np.arange(4), 20), np.tile(np.arange(1, 21), 4)
    config = AttentionConfig(**{**SMALL.__dict__, "epochs": 1})
    module = train_module(series, rows, origins, config, sample_weights=np.linspace(1, 5, 80))
    save_checkpoint(module, tmp_path / "m.pt", {"contract_version": "1.0"})
    loaded, meta = load_checkpoint(tmp_path / "m.pt")
    assert meta == {"contract_version": "1.0"} and loaded.config == config
    probe_rows, probe_origins = np.arange(4), np.full(4, 28)
    np.testing.assert_allclose(
        predict(loaded, series, probe_rows, probe_origins),
        predict(module, series, probe_rows, probe_origins),
    )


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="divisible"):
        AttentionConfig(d_model=10, heads=4)
    with pytest.raises(ValueError, match="scales"):
        AttentionConfig(scales=(1, 0))
    with pytest.raises(ValueError, match="epoch_samples"):
        AttentionConfig(epoch_samples=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_an_epoch_draws_at_most_epoch_samples(weighted: bool) -> None:
    """The bound on training time: 450 samples, 100 an epoch in batches of 50 -> 2 steps each."""
    series = np.random.default_rng(0).poisson(5, (3, 200)).astype(float)
    rows, origins = np.repeat(np.arange(3), 150), np.tile(np.arange(30, 180), 3)
    weights = np.linspace(1, 2, 450) if weighted else None
    steps = []
    for epoch_samples in (100, 20_000):
        config = replace(SMALL, epochs=2, batch_size=50, epoch_samples=epoch_samples)
        steps.append(train_module(series, rows, origins, config, weights).trainer.global_step)
    assert steps == [2 * 2, 2 * 9]

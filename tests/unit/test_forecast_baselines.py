"""Baseline forecasters: exact values on hand-computed series, parameter recovery, no leakage."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.base import Forecaster
from models.forecast.baselines import (
    AutoRegressive,
    Ewma,
    MovingAverage,
    Naive,
    SeasonalNaive,
    baseline_suite,
)

SEASON = 7
HORIZON = 6


def _bursty(n: int, seed: int = 0) -> np.ndarray:
    """Weekly-ish counts with idle stretches and heavy-tailed bursts."""
    rng = np.random.default_rng(seed)
    base = 20 + 10 * np.sin(2 * np.pi * np.arange(n) / SEASON)
    counts = rng.poisson(base) * (rng.random(n) > 0.2) + rng.pareto(1.5, n) * (rng.random(n) < 0.05)
    return counts.astype(np.float64)


def _ar_series(intercept: float, coef: list[float], n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = len(coef)
    y = np.full(n + 200, intercept / (1 - sum(coef)))
    for t in range(p, y.size):
        y[t] = intercept + np.dot(coef, y[t - p : t][::-1]) + rng.normal()
    return y[200:]  # drop the burn-in


def test_naive_repeats_the_last_value_and_forecasts_zero_without_history() -> None:
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    got = Naive().fit(y).forecast(y, np.array([0, 1, 3, 5]), 2)
    np.testing.assert_array_equal(got, [[0, 0], [1, 1], [3, 3], [5, 5]])


def test_seasonal_naive_takes_the_last_season_before_the_origin() -> None:
    y = np.arange(1.0, 8.0)  # y[i] = i + 1
    model = SeasonalNaive(3).fit(y)
    # origin 6, targets 6..9 -> indices 3, 4, 5, then 3 again (horizon past one season)
    np.testing.assert_array_equal(model.forecast(y, np.array([6]), 4), [[4, 5, 6, 4]])
    np.testing.assert_array_equal(model.forecast(y, np.array([4]), 2), [[2, 3]])
    # origin 2: target 2 has no value one season back (index -1) -> last value 2; target 3 -> y[0]
    np.testing.assert_array_equal(model.forecast(y, np.array([2]), 2), [[2, 1]])
    np.testing.assert_array_equal(model.forecast(y, np.array([0]), 2), [[0, 0]])


def test_moving_average_uses_the_last_window_or_what_exists() -> None:
    y = np.arange(1.0, 8.0)
    got = MovingAverage(window=5).fit(y).forecast(y, np.array([7, 5, 2, 0]), 2)
    np.testing.assert_array_equal(got, [[5, 5], [3, 3], [1.5, 1.5], [0, 0]])


def test_ewma_level_with_a_fixed_alpha() -> None:
    y = np.array([4.0, 8.0, 0.0])  # levels 4, 6, 3 at alpha 0.5
    model = Ewma(alphas=[0.5]).fit(y)
    np.testing.assert_array_equal(
        model.forecast(y, np.array([1, 2, 3]), 2), [[4, 4], [6, 6], [3, 3]]
    )


def test_ewma_chooses_alpha_by_one_step_mae() -> None:
    # alpha 1 errs by 10 every step; alpha 0.5 errs by 10, 5, 7.5, 6.25 (mean 7.1875)
    y = np.array([0.0, 10.0, 0.0, 10.0, 0.0])
    assert Ewma(alphas=[1.0, 0.5]).fit(y).alpha == 0.5


def test_ewma_alpha_follows_the_process() -> None:
    rng = np.random.default_rng(1)
    walk = 1000 + np.cumsum(rng.normal(size=2000))  # best one-step forecast: the last value
    noise = 100 + rng.normal(size=2000)  # best one-step forecast: the long-run mean
    assert Ewma().fit(walk).alpha >= 0.9
    assert Ewma().fit(noise).alpha <= 0.1


def test_ar1_recovers_the_coefficient_and_the_mean() -> None:
    y = _ar_series(30.0, [0.7], 3000)
    model = AutoRegressive(orders=[1]).fit(y)
    assert model.p == 1
    assert model.coef[0] == pytest.approx(0.7, abs=0.05)
    assert model.intercept / (1 - model.coef[0]) == pytest.approx(100.0, rel=0.02)


def test_ar_selects_an_order_that_captures_lag_two() -> None:
    y = _ar_series(30.0, [0.1, 0.6], 3000, seed=2)
    model = AutoRegressive().fit(y)
    assert model.p is not None and model.p >= 2
    np.testing.assert_allclose(model.coef[:2], [0.1, 0.6], atol=0.1)


def test_ar_iterates_recursively_on_an_exact_process() -> None:
    y = np.zeros(20)
    for t in range(1, y.size):
        y[t] = 2 + 0.5 * y[t - 1]
    model = AutoRegressive(orders=[1]).fit(y[:12])
    assert model.intercept == pytest.approx(2.0, abs=1e-9)
    assert model.coef[0] == pytest.approx(0.5, abs=1e-9)
    first = 2 + 0.5 * y[2]
    np.testing.assert_allclose(
        model.forecast(y, np.array([3]), 2), [[first, 2 + 0.5 * first]], rtol=1e-9
    )


def test_ar_clips_at_zero_and_handles_origins_before_p() -> None:
    y = np.array([100.0, 80.0, 60.0, 40.0, 20.0, 0.0] * 4)  # falling saw: AR overshoots below 0
    model = AutoRegressive(orders=[3]).fit(y)
    got = model.forecast(y, np.arange(y.size + 1), 10)
    assert np.all(np.isfinite(got)) and np.all(got >= 0)
    np.testing.assert_array_equal(got[0], 0.0)
    # origin 2 < p = 3: the missing lag is the mean of what exists
    lags = np.array([y[1], y[0], (y[0] + y[1]) / 2])
    expected = max(model.intercept + lags @ model.coef, 0.0)
    assert got[2, 0] == pytest.approx(expected)


@pytest.mark.parametrize("method", baseline_suite(SEASON), ids=lambda m: m.name)
@pytest.mark.parametrize("garbage", [1e9, np.nan])
def test_forecasts_never_read_at_or_after_the_origin(method: Forecaster, garbage: float) -> None:
    series = _bursty(300)
    method.fit(series[:200])
    for origin in [0, 1, 2, 3, 5, 6, 7, 8, 24, 25, 100, 199, 200, 250, 299, 300]:
        spoiled = series.copy()
        spoiled[origin:] = garbage
        origins = np.array([origin])
        np.testing.assert_array_equal(
            method.forecast(spoiled, origins, HORIZON), method.forecast(series, origins, HORIZON)
        )


@pytest.mark.parametrize("method", baseline_suite(SEASON), ids=lambda m: m.name)
def test_batch_forecasts_match_one_origin_at_a_time(method: Forecaster) -> None:
    series = _bursty(300, seed=3)
    method.fit(series[:200])
    origins = np.arange(0, 301, 7)
    batch = method.forecast(series, origins, HORIZON)
    assert batch.shape == (origins.size, HORIZON)
    assert np.all(np.isfinite(batch)) and np.all(batch >= 0)
    single = np.vstack([method.forecast(series, np.array([o]), HORIZON) for o in origins])
    np.testing.assert_allclose(batch, single, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("method", baseline_suite(SEASON), ids=lambda m: m.name)
def test_fit_returns_self_and_leaves_the_train_part_alone(method: Forecaster) -> None:
    train = _bursty(200)
    before = train.copy()
    assert method.fit(train) is method
    np.testing.assert_array_equal(train, before)


def test_bad_arguments_are_refused() -> None:
    y = _bursty(50)
    with pytest.raises(ValueError, match="origins must lie"):
        Naive().forecast(y, np.array([51]), 1)
    with pytest.raises(ValueError, match="horizon"):
        Naive().forecast(y, np.array([5]), 0)
    with pytest.raises(ValueError, match="integer"):
        Naive().forecast(y, np.array([5.0]), 1)
    with pytest.raises(RuntimeError, match="fit"):
        Ewma().forecast(y, np.array([5]), 1)
    with pytest.raises(RuntimeError, match="fit"):
        AutoRegressive().forecast(y, np.array([5]), 1)
    with pytest.raises(ValueError, match="NaN"):
        Ewma().fit(np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="season"):
        SeasonalNaive(0)


def test_suite_names_and_protocol() -> None:
    assert [m.name for m in baseline_suite(SEASON)] == [
        "naive",
        "seasonal_naive",
        "moving_average",
        "ewma",
        "ar",
    ]
    assert "seasonal_naive" not in [m.name for m in baseline_suite(None)]
    assert all(isinstance(m, Forecaster) for m in baseline_suite(SEASON))

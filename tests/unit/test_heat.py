"""Property tests of the coupled decay: bounded, monotone, exact half-life."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import FakeClock
from hypothesis import given
from hypothesis import strategies as st

from cache_runtime.heat import (
    DAY_S,
    DEFAULT_HALF_LIFE_S,
    DecayParams,
    coupled_heat,
    decay_params_path,
    tuned_half_life_s,
)

NOW = 1_700_000_000.0
clock = FakeClock(NOW)
sims = st.floats(0, 1)
ages = st.floats(0, 400 * DAY_S)
priorities = st.integers(1, 10)
half_lives = st.floats(1, 30 * DAY_S)


def heat(
    sim: float, age: float, priority: int, half_life: float = DecayParams().half_life_s
) -> float:
    return float(coupled_heat(sim, NOW - age, priority, DecayParams(half_life), clock))


def test_default_is_the_classic_half_a_per_day() -> None:
    params = DecayParams()
    assert params.lambda_per_s * DAY_S == pytest.approx(0.5)
    assert params.half_life_s / DAY_S == pytest.approx(1.386, abs=1e-3)
    assert DecayParams.from_lambda_per_day(0.5) == params


@given(sims, ages, priorities, half_lives)
def test_bounded_in_unit_interval(sim: float, age: float, priority: int, half_life: float) -> None:
    assert 0.0 <= heat(sim, age, priority, half_life) <= 1.0


@given(sims, ages, ages, priorities)
def test_monotone_non_increasing_in_age(sim: float, a: float, b: float, priority: int) -> None:
    young, old = min(a, b), max(a, b)
    assert heat(sim, old, priority) <= heat(sim, young, priority)


@given(sims, ages, priorities, priorities)
def test_monotone_non_decreasing_in_priority(sim: float, age: float, p: int, q: int) -> None:
    low, high = min(p, q), max(p, q)
    assert heat(sim, age, low) <= heat(sim, age, high)


@given(st.floats(0.01, 1), priorities, half_lives)
def test_exact_half_life(sim: float, priority: int, half_life: float) -> None:
    assert heat(sim, half_life, priority, half_life) == pytest.approx(heat(sim, 0, priority) / 2)
    assert heat(sim, 3 * half_life, priority, half_life) == pytest.approx(
        heat(sim, 0, priority) / 8
    )


def test_vectorised_and_future_timestamps_are_age_zero() -> None:
    sims_ = np.array([1.0, 0.5, 1.0])
    seen = np.array(
        [NOW, NOW - DecayParams().half_life_s, NOW + 3600]
    )  # the last from a skewed clock
    out = coupled_heat(sims_, seen, np.array([10, 10, 5]), clock=clock)
    assert out.shape == (3,)
    np.testing.assert_allclose(out, [1.0, 0.25, 0.5])


@pytest.mark.parametrize(
    ("sim", "priority", "seen", "message"),
    [
        (1.5, 5, NOW, "sim must be in"),
        (-0.1, 5, NOW, "sim must be in"),
        (float("nan"), 5, NOW, "sim must be in"),
        (0.5, 0, NOW, "priority must be"),
        (0.5, 11, NOW, "priority must be"),
        (0.5, 5.5, NOW, "priority must be"),
        (0.5, 5, math.inf, "last_seen_s must be finite"),
    ],
)
def test_bad_input_is_rejected(sim: float, priority: float, seen: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        coupled_heat(sim, seen, priority, clock=clock)


def test_bad_params_are_rejected() -> None:
    with pytest.raises(ValueError):
        DecayParams(half_life_s=0)
    with pytest.raises(ValueError):
        DecayParams.from_lambda_per_day(-1)


def test_priority_weight_scales_the_priority_term() -> None:
    clock = FakeClock(1000.0)
    seen = np.full(3, 1000.0)
    priorities = np.array([1, 5, 10])
    flat = coupled_heat(1.0, seen, priorities, DecayParams(priority_weight=0.0), clock)
    square = coupled_heat(1.0, seen, priorities, DecayParams(priority_weight=2.0), clock)
    np.testing.assert_allclose(flat, [1.0, 1.0, 1.0])
    np.testing.assert_allclose(square, [0.01, 0.25, 1.0])


def test_tiers_keep_their_default_until_a_tuning_is_published(tmp_path) -> None:
    path = decay_params_path(tmp_path)
    assert tuned_half_life_s(path) == DEFAULT_HALF_LIFE_S
    DecayParams(half_life_s=42.0, priority_weight=0.5).save(path, objective=0.1)
    assert tuned_half_life_s(path) == 42.0
    assert DecayParams.load(path).priority_weight == 0.5

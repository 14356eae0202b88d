"""`preheat` combines its experts online, from past errors only; tail weights."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.baselines import MovingAverage, Naive
from models.forecast.evaluation import evaluate
from models.forecast.selection import PreheatForecaster
from models.forecast.weighting import demand_entropy, key_weights, tail_weight


def _regime_change(seed: int = 0, noisy: int = 450, walk: int = 150) -> np.ndarray:
    """Noise around a level (moving average wins), then a random walk (naive wins)."""
    rng = np.random.default_rng(seed)
    level = 100 + rng.normal(0, 10, noisy)
    steps = 100 + np.cumsum(rng.normal(0, 10, walk))
    return np.clip(np.r_[level, steps], 0, None)


def _cheap() -> list:
    return [Naive(), MovingAverage(5)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_combination_tracks_the_expert_winning_each_half_of_the_test_part(seed: int) -> None:
    series, split = _regime_change(seed), 300  # test: 150 buckets of noise, then 150 of walk
    result = evaluate(
        {"preheat": PreheatForecaster(horizon=1, candidates=_cheap), "naive": Naive(),
         "ma": MovingAverage(5)}, series, split, 1,
    )  # fmt: skip
    errors = {name: s.origin_errors for name, s in result.scores.items()}
    halves = (slice(0, 150), slice(150, None))
    assert errors["ma"][halves[0]].mean() < 0.8 * errors["naive"][halves[0]].mean()
    assert errors["naive"][halves[1]].mean() < 0.8 * errors["ma"][halves[1]].mean()
    for half in halves:  # close to whichever expert wins this half
        best = min(errors["ma"][half].mean(), errors["naive"][half].mean())
        assert errors["preheat"][half].mean() < 1.15 * best  # measured up to 1.10
    assert result.scores["preheat"].mae < min(result.scores["ma"].mae, result.scores["naive"].mae)


def test_a_changed_future_changes_no_earlier_forecast_nor_the_fit() -> None:
    series, split, horizon = _regime_change(), 300, 3
    model = PreheatForecaster(horizon=horizon, candidates=_cheap).fit(series[:split])
    origins = np.arange(split, len(series) - horizon + 1)
    before = model.forecast(series, origins, horizon)
    changed = series.copy()
    changed[420:] = changed[420:][::-1] * 3
    after = model.forecast(changed, origins, horizon)
    np.testing.assert_array_equal(before[origins <= 420], after[origins <= 420])
    assert not np.allclose(before[origins > 423], after[origins > 423])
    refit = PreheatForecaster(horizon=horizon, candidates=_cheap).fit(changed[:split])
    assert refit.selection == model.selection


def test_weights_start_from_the_held_back_slice_and_sum_to_one() -> None:
    series, split = _regime_change(), 300
    model = PreheatForecaster(horizon=1, candidates=_cheap).fit(series[:split])
    assert model.selection is not None
    assert model.selection.validation_start == int(split * 0.8)
    assert set(model.selection.validation_mae) == {"naive", "moving_average"}
    first = model.weights(series, np.array([split]))[0]
    np.testing.assert_allclose(first, list(model.selection.weights.values()))
    assert first[1] > first[0]  # moving average won the noisy held-back slice
    weights = model.weights(series, np.arange(split, len(series)))
    np.testing.assert_allclose(weights.sum(1), 1.0)


def test_a_candidate_that_cannot_fit_is_left_out_with_a_note() -> None:
    class Fussy(Naive):
        name = "fussy"

        def fit(self, train: np.ndarray) -> Fussy:
            raise ValueError("needs more data")

    model = PreheatForecaster(horizon=1, candidates=lambda: [Fussy(), Naive()]).fit(np.ones(50))
    assert model.selection is not None and model.selection.notes == [
        "fussy left out: needs more data"
    ]


def test_too_short_a_train_part_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="validation origins"):
        PreheatForecaster(horizon=6, candidates=_cheap).fit(np.ones(20))


def test_tail_weight_follows_the_formula_and_its_directions() -> None:
    assert tail_weight(np.array([2.0]), np.array([1.0]), np.array([0.0]))[0] == pytest.approx(
        np.exp(0.9) / 1e-3
    )
    base = tail_weight(np.array([1.0]), np.array([1.0]), np.array([0.1]))[0]
    assert tail_weight(np.array([2.0]), np.array([1.0]), np.array([0.1]))[0] > base  # deeper
    assert tail_weight(np.array([1.0]), np.array([2.0]), np.array([0.1]))[0] > base  # irregular
    assert tail_weight(np.array([1.0]), np.array([1.0]), np.array([0.5]))[0] < base  # frequent
    with pytest.raises(ValueError, match="freq"):
        tail_weight(np.ones(1), np.ones(1), np.array([1.5]))
    with pytest.raises(ValueError, match="depth"):
        tail_weight(np.array([-1.0]), np.ones(1), np.ones(1) * 0.1)


def test_entropy_and_normalised_key_weights() -> None:
    counts = np.array([[4.0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [100, 100, 100, 100]])
    np.testing.assert_allclose(demand_entropy(counts), [0, np.log(4), 0, np.log(4)])
    weights = key_weights(counts)
    assert weights.mean() == pytest.approx(1.0)
    assert weights[1] > weights[3]  # same spread, the rare key weighs more
    capped = key_weights(counts, cap=2.0)
    assert capped.max() / np.median(capped) == pytest.approx(2.0)  # the freak key is held down
    assert capped.mean() == pytest.approx(1.0)

"""`preheat` chooses on validation inside the train part, never on the test part; tail weights."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.baselines import MovingAverage, Naive
from models.forecast.evaluation import evaluate
from models.forecast.selection import Blend, PreheatForecaster
from models.forecast.weighting import demand_entropy, key_weights, tail_weight


def _regime_change(seed: int = 0) -> np.ndarray:
    """Noise around a level for 300 buckets (moving average wins), then a random walk (naive)."""
    rng = np.random.default_rng(seed)
    noisy = 100 + rng.normal(0, 10, 300)
    walk = 100 + np.cumsum(rng.normal(0, 10, 100))
    return np.clip(np.r_[noisy, walk], 0, None)


def _cheap() -> list:
    return [Naive(), MovingAverage(5)]


def test_choice_is_made_on_validation_not_on_the_test_part() -> None:
    series = _regime_change()
    split = 300
    preheat = PreheatForecaster(horizon=2, candidates=_cheap)
    result = evaluate(
        {"preheat": preheat, "naive": Naive(), "ma": MovingAverage(5)}, series, split, 2
    )
    assert preheat.selection is not None
    # On the test part naive is better, yet preheat deployed what validation preferred.
    assert result.scores["naive"].mae < result.scores["ma"].mae
    assert preheat.selection.chosen in ("moving_average", "blend(moving_average+naive)")
    assert preheat.selection.validation_start == int(split * 0.8)


def test_changing_the_test_part_changes_nothing_preheat_chose() -> None:
    series = _regime_change()
    other = series.copy()
    other[300:] = other[300:][::-1] * 3
    chosen = []
    for data in (series, other):
        model = PreheatForecaster(horizon=2, candidates=_cheap)
        evaluate({"preheat": model}, data, 300, 2)
        assert model.selection is not None
        chosen.append((model.selection.chosen, model.selection.validation_mae))
    assert chosen[0] == chosen[1]


def test_blend_is_scored_on_the_half_it_was_not_picked_on() -> None:
    model = PreheatForecaster(horizon=1, candidates=_cheap).fit(_regime_change()[:300])
    assert model.selection is not None
    assert set(model.selection.validation_mae) == {
        "naive", "moving_average", "blend(moving_average+naive)"
    }  # fmt: skip
    assert model.selection.blend_members == ["moving_average", "naive"]


def test_blend_is_the_mean_of_its_members() -> None:
    series = np.arange(20.0)
    blend = Blend([Naive(), MovingAverage(5)]).fit(series)
    np.testing.assert_allclose(blend.forecast(series, np.array([10]), 1), [[(9 + 7) / 2]])


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

"""The forecasts' combination: it tracks whichever expert is winning and, on a steady series,
does at least as well as the best mix of the experts, from past rounds only."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.combination import BOA, AdaHedge, Combination, combine, online_weights


def _switching_series(rounds: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(2, rounds, 1) forecasts and (rounds, 1) actuals: expert A is off by 0-0.4 in the first
    half and 0.8-1.2 in the second, B the other way round, each error's sign at random."""
    rng = np.random.default_rng(seed)
    half = rounds // 2
    actual = rng.uniform(5.0, 15.0, rounds)
    off_a = np.r_[rng.uniform(0.0, 0.4, half), rng.uniform(0.8, 1.2, half)]
    off_b = np.r_[rng.uniform(0.8, 1.2, half), rng.uniform(0.0, 0.4, half)]
    signs = rng.choice([-1.0, 1.0], (2, rounds))
    forecasts = actual[None] + signs * np.stack([off_a, off_b])
    return forecasts[:, :, None], actual[:, None]


def _mixed_errors(forecasts: np.ndarray, actual: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.abs(combine(forecasts, weights) - actual)[:, 0]  # (N,)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_combination_follows_the_expert_winning_each_half(seed: int) -> None:
    forecasts, actual = _switching_series(seed=seed)
    weights = online_weights(forecasts, actual, np.arange(actual.shape[0]))  # i sees rounds < i
    errors = np.abs(forecasts - actual[None])[:, :, 0]  # (M, N)
    mixed = _mixed_errors(forecasts, actual, weights).sum()
    # the best expert of each half, in hindsight: 1.02-1.08x over seeds 0-5 (AdaHedge alone
    # 1.04-1.08x); a little of the loser mixed in can lower the error when the two err on
    # opposite sides, so the leader's weight is 0.90-0.99, not 1
    assert mixed < 1.15 * errors.min(0).sum()
    assert mixed < 0.6 * errors.sum(1).min()  # the better single expert in hindsight
    assert weights[150, 0] > 0.85 and weights[350, 1] > 0.85


def test_the_combination_beats_both_experts_when_a_mix_of_them_is_right() -> None:
    """The gradient trick: experts off by +1 and -3, so 3/4 of one and 1/4 of the other is the
    truth. Weighting by losses alone follows the +1 expert (error 1); BOA finds the mix."""
    rng = np.random.default_rng(4)
    actual = rng.uniform(5.0, 15.0, (300, 1))
    forecasts = np.stack([actual + 1.0, actual - 3.0])  # (2, N, 1)
    weights = online_weights(forecasts, actual, np.arange(300))
    assert _mixed_errors(forecasts, actual, weights)[100:].mean() < 0.3
    np.testing.assert_allclose(weights[-1], [0.75, 0.25], atol=0.05)


def test_weights_use_only_rounds_already_known() -> None:
    forecasts, actual = _switching_series()
    known = np.clip(np.arange(actual.shape[0]) - 2, 0, None)  # horizon 3: two rounds still open
    before = online_weights(forecasts, actual, known)
    poisoned = actual.copy()
    poisoned[300:] = 1e6 * poisoned[300:][::-1]
    after = online_weights(forecasts, poisoned, known)
    np.testing.assert_array_equal(before[:303], after[:303])
    assert not np.allclose(before[303:], after[303:])


def test_weights_do_not_depend_on_the_scale() -> None:
    forecasts, actual = _switching_series(100)
    known = np.arange(100)
    np.testing.assert_allclose(
        online_weights(forecasts, actual, known),
        online_weights(1e4 * forecasts, 1e4 * actual, known),
        atol=1e-9,
    )


def test_the_better_expert_gains_weight_and_the_state_round_trips() -> None:
    combination = Combination(3)
    for _ in range(50):
        combination.update(np.array([[10.0], [11.0], [13.0]]), np.array([10.0]))
    assert combination.weights.argmax() == 0 and combination.weights.sum() == pytest.approx(1.0)
    again = Combination.from_state(combination.state())
    for c in (combination, again):
        c.update(np.array([[13.0], [10.0], [11.0]]), np.array([10.0]))
    np.testing.assert_array_equal(combination.weights, again.weights)


def test_a_state_saved_before_boa_goes_on_as_the_tracking_half() -> None:
    """Registered forecasters saved an `AdaHedge.state()`; they must still load and learn."""
    hedge = AdaHedge(2)
    for _ in range(20):
        hedge.update(np.array([0.0, 1.0]))
    combination = Combination.from_state({**hedge.state(), "experts": ["a", "b"]})
    np.testing.assert_array_equal(combination.tracking.weights, hedge.weights)
    combination.update(np.array([[1.0], [3.0]]), np.array([1.0]))
    assert combination.weights[0] > 0.9


def test_adahedge_keeps_every_expert_alive_but_one_on_the_floor_does_not_vote() -> None:
    hedge = AdaHedge(3)
    for _ in range(50):
        hedge.update(np.array([1.0, 2.0, 3.0]))
    kept = np.array(hedge.state()["weights"])
    assert kept.min() >= hedge.share / 3
    assert hedge.weights[2] == 0.0


def test_combine_is_the_weighted_mean_of_the_experts() -> None:
    forecasts = np.array([[[1.0, 1.0]], [[3.0, 5.0]]])  # (M=2, N=1, H=2)
    np.testing.assert_allclose(combine(forecasts, np.array([[0.25, 0.75]])), [[2.5, 4.0]])


@pytest.mark.parametrize(
    ("forecasts", "actual", "message"),
    [
        (np.zeros((0, 3, 1)), np.zeros((3, 1)), "at least one expert"),
        (np.ones((2, 3, 1)), np.ones((3, 2)), r"actuals \(rounds, ...\) alike"),
        (
            np.array([[[1.0], [2.0]], [[1.0], [np.nan]]]),
            np.ones((2, 1)),
            "NaN or inf from expert 1",
        ),
        (np.ones((2, 2, 1)), np.array([[1.0], [np.inf]]), "finite values"),
    ],
)
def test_bad_input_is_a_clear_error(
    forecasts: np.ndarray, actual: np.ndarray, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        online_weights(forecasts, actual, np.full(actual.shape[0], actual.shape[0]))


def test_known_counts_must_fit_the_rounds_and_share_must_be_positive() -> None:
    forecasts, actual = np.ones((2, 3, 1)), np.ones((3, 1))
    with pytest.raises(ValueError, match=r"lie in \[0, 3\]"):
        online_weights(forecasts, actual, np.array([0, 2, 4]))
    with pytest.raises(ValueError, match="non-decreasing"):
        online_weights(forecasts, actual, np.array([2, 1]))
    with pytest.raises(ValueError, match="share"):
        Combination(2, share=0.0)
    with pytest.raises(ValueError, match="at least one expert"):
        BOA(0)

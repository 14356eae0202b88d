"""AdaHedge with fixed share: it tracks whichever expert is winning, from past losses only."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.combination import AdaHedge, combine, online_weights


def _switching_losses(rounds: int = 400, seed: int = 0) -> np.ndarray:
    """(rounds, 2): expert A wins the first half, B the second, with noise."""
    rng = np.random.default_rng(seed)
    half = rounds // 2
    a = np.r_[rng.uniform(0.0, 0.4, half), rng.uniform(0.8, 1.2, half)]
    b = np.r_[rng.uniform(0.8, 1.2, half), rng.uniform(0.0, 0.4, half)]
    return np.column_stack([a, b])


def test_the_combination_follows_the_expert_winning_each_half() -> None:
    losses = _switching_losses()
    weights = online_weights(losses, np.arange(len(losses)))  # round i sees rounds < i
    mixed = (weights * losses).sum(1)  # (N,)
    switching = losses.min(1).sum()  # the best expert of each half, in hindsight
    single = losses.sum(0).min()  # the better single expert in hindsight
    assert mixed.sum() < 1.25 * switching  # measured 1.11-1.14 over seeds
    assert mixed.sum() < 0.6 * single
    assert weights[150, 0] > 0.95 and weights[350, 1] > 0.95


def test_weights_use_only_rounds_already_known() -> None:
    losses = _switching_losses()
    known = np.clip(np.arange(len(losses)) - 2, 0, None)  # horizon 3: two rounds still open
    before = online_weights(losses, known)
    poisoned = losses.copy()
    poisoned[300:] = 1e6 * poisoned[300:][::-1]
    after = online_weights(poisoned, known)
    np.testing.assert_array_equal(before[:303], after[:303])
    assert not np.allclose(before[303:], after[303:])


def test_weights_do_not_depend_on_the_loss_scale() -> None:
    losses = _switching_losses(100)
    known = np.arange(100)
    np.testing.assert_allclose(online_weights(losses, known), online_weights(1e4 * losses, known))


def test_the_better_expert_gains_weight_and_the_state_round_trips() -> None:
    hedge = AdaHedge(3)
    for _ in range(50):
        hedge.update(np.array([1.0, 2.0, 3.0]))
    assert hedge.weights.argmax() == 0 and hedge.weights.sum() == pytest.approx(1.0)
    kept = np.array(hedge.state()["weights"])
    assert kept.min() >= hedge.share / 3  # the fixed share keeps every expert alive ...
    assert hedge.weights[2] == 0.0  # ... but one held up only by the floor does not vote
    again = AdaHedge.from_state(hedge.state())
    for h in (hedge, again):
        h.update(np.array([3.0, 1.0, 2.0]))
    np.testing.assert_array_equal(hedge.weights, again.weights)


def test_combine_is_the_weighted_mean_of_the_experts() -> None:
    forecasts = np.array([[[1.0, 1.0]], [[3.0, 5.0]]])  # (M=2, N=1, H=2)
    np.testing.assert_allclose(combine(forecasts, np.array([[0.25, 0.75]])), [[2.5, 4.0]])


@pytest.mark.parametrize(
    ("losses", "message"),
    [
        (np.zeros((3, 0)), "at least one expert"),
        (np.array([[1.0, np.nan], [1.0, 2.0]]), "NaN or inf at round 0, expert 1"),
        (np.ones(3), r"\(rounds, experts\)"),
    ],
)
def test_bad_losses_are_a_clear_error(losses: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        online_weights(losses, np.zeros(len(losses), dtype=int))


def test_known_counts_must_fit_the_rounds_and_share_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"lie in \[0, 3\]"):
        online_weights(np.ones((3, 2)), np.array([0, 2, 4]))
    with pytest.raises(ValueError, match="non-decreasing"):
        online_weights(np.ones((3, 2)), np.array([2, 1]))
    with pytest.raises(ValueError, match="share"):
        AdaHedge(2, share=0.0)
    with pytest.raises(ValueError, match="at least one expert"):
        AdaHedge(0)

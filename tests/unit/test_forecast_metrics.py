"""Forecast metrics, the block bootstrap and rolling-origin evaluation: exact values, no leakage."""

from __future__ import annotations

import numpy as np
import pytest

from models.forecast.baselines import AutoRegressive, Ewma, Naive, baseline_suite
from models.forecast.evaluation import (
    chronological_split,
    compare_to_best_baseline,
    evaluate,
    rolling_origins,
)
from models.forecast.metrics import block_bootstrap_ci, diebold_mariano, mae, mase, smape


def _seasonal(n: int, season: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 50 + 30 * np.sin(2 * np.pi * np.arange(n) / season) + rng.normal(size=n)


def test_mae_exact_on_any_shape() -> None:
    assert mae([1.0, 2.0, 3.0], [2.0, 2.0, 5.0]) == pytest.approx(1.0)
    assert mae([[1.0, 2.0], [3.0, 4.0]], [[1.0, 0.0], [3.0, 8.0]]) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="same shape"):
        mae([1.0, 2.0], [1.0])


def test_smape_counts_zero_over_zero_as_a_perfect_forecast() -> None:
    # terms: 0/0 -> 0, 2*2/(1+3) = 1, 0 -> mean 1/3 -> 33.3%
    assert smape([0.0, 1.0, 2.0], [0.0, 3.0, 2.0]) == pytest.approx(100 / 3)
    assert smape([0.0, 0.0], [0.0, 0.0]) == 0.0
    assert smape([0.0], [5.0]) == pytest.approx(200.0)  # the upper bound


def test_mase_is_scaled_by_the_train_naive_mae() -> None:
    train = np.array([1.0, 3.0, 2.0, 4.0])  # |diffs| 2, 1, 2 -> scale 5/3
    assert mase([1.0, 2.0], [2.0, 4.0], train) == pytest.approx(1.5 / (5 / 3))


def test_mase_refuses_a_constant_train_part() -> None:
    with pytest.raises(ValueError, match="lag-1 naive MAE is 0"):
        mase([1.0], [2.0], np.full(10, 3.0))
    with pytest.raises(ValueError, match="at least 2"):
        mase([1.0], [2.0], np.array([3.0]))


def test_bootstrap_ci_contains_the_true_difference() -> None:
    rng = np.random.default_rng(5)
    b = rng.gamma(2.0, 10.0, size=400)
    a = b + 0.5 + rng.normal(size=400)  # true mean difference 0.5
    lo, hi = block_bootstrap_ci(a, b)
    assert lo < 0.5 < hi
    assert lo > 0  # a is detectably worse
    assert block_bootstrap_ci(b, a) == pytest.approx((-hi, -lo))


def test_bootstrap_is_deterministic_by_seed() -> None:
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=200), rng.normal(size=200)
    assert block_bootstrap_ci(a, b, seed=3) == block_bootstrap_ci(a, b, seed=3)
    assert block_bootstrap_ci(a, b, seed=3) != block_bootstrap_ci(a, b, seed=4)


def test_bootstrap_edge_cases_are_exact() -> None:
    a = np.arange(10.0)
    assert block_bootstrap_ci(a + 2, a) == pytest.approx((2.0, 2.0))  # constant difference
    lo, hi = block_bootstrap_ci(a, np.zeros(10), block=10)  # one block: every resample is all
    assert lo == pytest.approx(4.5) and hi == pytest.approx(4.5)


def test_blocks_widen_the_interval_for_autocorrelated_errors() -> None:
    rng = np.random.default_rng(7)
    diff = np.zeros(600)
    for t in range(1, diff.size):
        diff[t] = 0.9 * diff[t - 1] + rng.normal()
    iid = block_bootstrap_ci(diff, np.zeros_like(diff), block=1)
    blocked = block_bootstrap_ci(diff, np.zeros_like(diff), block=30)
    assert blocked[1] - blocked[0] > 1.5 * (iid[1] - iid[0])


def test_chronological_split() -> None:
    assert chronological_split(100, 0.25) == 75
    assert chronological_split(2016, 0.25) == 1512
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="test_frac"):
            chronological_split(100, bad)
    with pytest.raises(ValueError, match="need 2"):
        chronological_split(2, 0.5)


@pytest.mark.parametrize(
    ("split", "n", "horizon", "step"), [(75, 100, 6, 1), (75, 100, 6, 4), (10, 11, 1, 1)]
)
def test_rolling_origins_keep_every_target_in_the_test_part(
    split: int, n: int, horizon: int, step: int
) -> None:
    origins = rolling_origins(split, n, horizon, step)
    targets = origins[:, None] + np.arange(horizon)
    assert targets.min() >= split and targets.max() <= n - 1
    assert origins[0] == split
    assert np.all(np.diff(origins) == step)
    assert origins[-1] + step > n - horizon  # no room left for another
    with pytest.raises(ValueError, match="no origin fits"):
        rolling_origins(n - horizon + 1, n, horizon)


def test_evaluate_naive_matches_hand_computation() -> None:
    series = np.array([1.0, 3.0, 2.0, 4.0, 6.0, 5.0, 9.0])
    result = evaluate({"naive": Naive()}, series, split=4, horizon=1)
    np.testing.assert_array_equal(result.origins, [4, 5, 6])
    score = result.scores["naive"]
    # forecasts 4, 6, 5 for actuals 6, 5, 9 -> errors 2, 1, 4
    np.testing.assert_array_equal(score.origin_errors, [2.0, 1.0, 4.0])
    assert score.mae == pytest.approx(7 / 3)
    assert score.mase == pytest.approx((7 / 3) / (5 / 3))  # train |diffs| 2, 1, 2
    assert result.summary()["naive"]["smape"] == pytest.approx(smape([6, 5, 9], [4, 6, 5]))


class _Spy:
    """Records what `fit` was given; forecasts naively."""

    name = "spy"

    def __init__(self) -> None:
        self.seen: np.ndarray | None = None

    def fit(self, train: np.ndarray) -> _Spy:
        self.seen = train
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        return Naive().forecast(series, origins, horizon)


def test_evaluate_fits_on_a_copy_of_the_train_part_only() -> None:
    series = _seasonal(200)
    spy = _Spy()
    evaluate({"spy": spy}, series, split=150, horizon=6)
    assert spy.seen is not None
    np.testing.assert_array_equal(spy.seen, series[:150])
    assert not np.shares_memory(spy.seen, series)  # no view whose .base reaches the test part


def test_evaluate_fit_and_scale_ignore_the_test_part() -> None:
    series = _seasonal(400, seed=1)
    changed = series.copy()
    changed[300:] = changed[300:] * 5 + 1000  # a different test part, same train part
    runs = []
    for s in (series, changed):
        ewma, ar = Ewma(), AutoRegressive()
        result = evaluate({"ewma": ewma, "ar": ar}, s, split=300, horizon=6)
        runs.append((ewma.alpha, ar.p, ar.intercept, ar.coef.copy(), result.scale))
    (alpha0, p0, c0, coef0, scale0), (alpha1, p1, c1, coef1, scale1) = runs
    assert (alpha0, p0, c0, scale0) == (alpha1, p1, c1, scale1)
    np.testing.assert_array_equal(coef0, coef1)


def test_evaluate_prefitted_skips_fit() -> None:
    series = _seasonal(200)
    spy = _Spy()
    evaluate({"spy": spy}, series, split=150, horizon=6, prefitted=True)
    assert spy.seen is None


def test_compare_names_the_best_baseline_and_a_significant_gap() -> None:
    series = _seasonal(1200, seed=2)
    methods = {m.name: m for m in baseline_suite(12)}
    result = evaluate(methods, series, split=chronological_split(series.size, 0.25), horizon=6)
    mases = {name: s.mase for name, s in result.scores.items()}
    others = [n for n in mases if n != "naive"]
    cmp = compare_to_best_baseline(result, "naive", others)
    assert cmp.best_baseline == min(others, key=mases.get)
    assert cmp.baseline_mase == min(mases[n] for n in others)
    assert cmp.mae_diff == pytest.approx(
        result.scores["naive"].mae - result.scores[cmp.best_baseline].mae
    )
    lo, hi = cmp.mae_diff_ci95
    assert 0 < lo <= cmp.mae_diff <= hi  # naive cannot follow a clean season over 6 steps
    with pytest.raises(ValueError, match="not in the evaluation"):
        compare_to_best_baseline(result, "missing")


def test_diebold_mariano_finds_a_real_gap_and_not_a_made_up_one() -> None:
    rng = np.random.default_rng(0)
    base = rng.gamma(2.0, 1.0, 400)
    stat, _, p_lower = diebold_mariano(0.8 * base, base)
    assert stat < 0 and p_lower < 0.001
    _, p_two, p_lower = diebold_mariano(base + rng.normal(0, 0.5, 400), base)
    assert p_two > 0.05 and p_lower > 0.05
    assert diebold_mariano(base, base) == (0.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="at least 3 finite"):
        diebold_mariano(np.ones(2), np.ones(2))

"""Threshold calibration: the right threshold on constructed scores, conservative on fresh ones."""

from __future__ import annotations

import numpy as np
import pytest

from models.templates.semantic_calibration import (
    Calibration,
    calibrate,
    choose_threshold,
    fhr_upper_bound,
)


def _constructed() -> list[tuple[float, int]]:
    """100 negatives at 0.00, 0.01, ..., 0.99 and 50 positives at 0.50, 0.51, ..., 0.99."""
    negatives = [(i / 100, 0) for i in range(100)]
    positives = [(0.5 + i / 100, 1) for i in range(50)]
    return negatives + positives


def test_empirical_rule_picks_the_smallest_threshold_meeting_the_target() -> None:
    calibration = calibrate(_constructed(), target_fhr=0.05, rule="empirical")
    # 5 negatives (0.95..0.99) may hit; the sixth highest, 0.94, must not.
    assert 0.94 < calibration.threshold < 0.9400001
    assert calibration.achieved_fhr_on_calibration == 0.05
    assert calibration.recall_on_calibration == pytest.approx(5 / 50)
    negatives = [s for s, y in _constructed() if y == 0]
    assert sum(s >= 0.94 for s in negatives) / len(negatives) > 0.05  # any lower lets 6 through


def test_rules_order_from_strict_to_lenient() -> None:
    pairs = _constructed()
    thresholds = [calibrate(pairs, 0.05, rule=r).threshold for r in RULE_ORDER]
    assert thresholds == sorted(thresholds, reverse=True)
    assert thresholds[0] > thresholds[-1]


RULE_ORDER = ("clopper-pearson", "plus-one", "empirical")


def test_clopper_pearson_bound_matches_the_beta_quantile() -> None:
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((0, 299), (1, 500), (5, 1000), (30, 2000)):
        expected = stats.beta.ppf(0.95, k + 1, n - k)
        assert fhr_upper_bound(k, n) == pytest.approx(expected, rel=1e-6)
    assert fhr_upper_bound(0, 299) == pytest.approx(0.00997, abs=1e-4)  # "rule of three"


def test_clopper_pearson_holds_on_unseen_pairs_where_the_point_estimate_does_not() -> None:
    """Scores from a known model: negatives N(0, 1), target 1%. Calibrate on 1,000 negatives many
    times; the true false-hit rate of each threshold is known exactly (normal tail)."""
    from statistics import NormalDist

    rng = np.random.default_rng(0)
    tail = NormalDist()
    over = {"clopper-pearson": 0, "empirical": 0}
    trials = 200
    for _ in range(trials):
        scores = np.concatenate([rng.standard_normal(1000), rng.normal(3, 1, 200)])
        labels = np.concatenate([np.zeros(1000, int), np.ones(200, int)])
        for rule in over:
            t, _, _ = choose_threshold(scores, labels, 0.01, rule, 0.95)
            over[rule] += (1 - tail.cdf(t)) > 0.01
    assert over["clopper-pearson"] / trials <= 0.08  # 95% confidence: about 5% of calibrations
    assert over["empirical"] / trials >= 0.3


def test_too_few_negatives_is_not_certified() -> None:
    pairs = [(0.1 * i, 0) for i in range(50)] + [(0.95, 1)]
    calibration = calibrate(pairs, target_fhr=0.01)
    assert not calibration.certified
    assert calibration.threshold > 4.9 and calibration.achieved_fhr_on_calibration == 0.0


def test_calibration_needs_negatives_and_a_sane_target() -> None:
    with pytest.raises(ValueError, match="label-0"):
        calibrate([(0.9, 1)])
    with pytest.raises(ValueError, match="target_fhr"):
        calibrate(_constructed(), target_fhr=0.0)
    with pytest.raises(ValueError, match="unknown calibration rule"):
        calibrate(_constructed(), rule="magic")


def test_json_round_trip_records_the_data_and_checks_its_digest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    calibration = calibrate(_constructed(), target_fhr=0.05)
    path = tmp_path / "calibration.json"
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded == calibration
    assert len(loaded.scores) == calibration.n_pairs == 150
    tampered = path.read_text().replace('"labels": [\n    0', '"labels": [\n    1', 1)
    with pytest.raises(ValueError, match="digest"):
        Calibration.from_json(tampered)

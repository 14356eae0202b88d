"""Forecaster registry: save/load round trip, the gating metric by hand, the promotion rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import DEMAND_BUCKET, DEMAND_START, demand_from_rows

from data_contracts import CONTRACT_VERSION, KeyForecast
from models.forecast.attention import AttentionConfig, train_module
from models.forecast.gating import (
    HotSetComparison,
    WindowActuals,
    evaluate_on_window,
    promotion_decision,
    tail_coverage_on_window,
)
from models.forecast.panel import OTHER_KEY, TOTAL_KEY, DemandGrid, KeyPanel, PanelForecaster
from models.forecast.registry import (
    META_FILE,
    WEIGHTS_FILE,
    Champion,
    _hot_set_pair,
    _panel_predictor,
    load_panel_forecaster,
    save_panel_forecaster,
)

START = pd.Timestamp(DEMAND_START)
WIDTH = pd.Timedelta(DEMAND_BUCKET)
CONFIG = AttentionConfig(epochs=1, context=4, scales=(1, 2), horizon=2, d_model=8, heads=2)


def _noisy_demand(buckets: int = 24, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for tenant, rates in (("acme", (8.0, 3.0, 1.0)), ("globex", (5.0, 2.0))):
        for t in range(buckets):
            counts = rng.poisson(rates)
            rows += [(tenant, f"template:k{i}", t, float(c)) for i, c in enumerate(counts) if c]
            rows.append((tenant, TOTAL_KEY, t, float(counts.sum() + 1)))
    return demand_from_rows(rows)


def test_round_trip_of_a_baseline_forecaster_keeps_its_forecasts(tmp_path: Path) -> None:
    panel = KeyPanel.from_demand(_noisy_demand(), top_k=3, recent=6)
    fitted = PanelForecaster(CONFIG).fit(panel)
    fitted.chosen = "ewma"  # whatever won, a baseline must not write weights
    meta = save_panel_forecaster(fitted, tmp_path / "model", top_k=3, recent=6, granularity="3min")

    loaded, top_k, recent, read = load_panel_forecaster(tmp_path / "model")

    assert (top_k, recent, read) == (3, 6, meta)
    assert read["contract_version"] == CONTRACT_VERSION
    assert read["git_commit"] and read["config"]["scales"] == [1, 2]
    assert not (tmp_path / "model" / WEIGHTS_FILE).exists()
    assert loaded.config == CONFIG and loaded.alpha == fitted.alpha
    pd.testing.assert_frame_equal(loaded.forecast(panel), fitted.forecast(panel))


def test_round_trip_of_an_attention_forecaster_keeps_its_weights(tmp_path: Path) -> None:
    panel = KeyPanel.from_demand(_noisy_demand(), top_k=3, recent=6)
    origins = np.arange(1, panel.counts.shape[1] - CONFIG.horizon + 1)
    rows = np.repeat(np.arange(len(panel.counts)), len(origins))
    module = train_module(panel.counts, rows, np.tile(origins, len(panel.counts)), CONFIG)
    fitted = PanelForecaster(CONFIG, chosen="attention", alpha=0.3, module=module)
    save_panel_forecaster(fitted, tmp_path / "model", top_k=3, recent=6, granularity="3min")

    loaded, *_ = load_panel_forecaster(tmp_path / "model")

    assert (tmp_path / "model" / WEIGHTS_FILE).exists()
    assert (tmp_path / "model" / META_FILE).exists()
    for name, tensor in module.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], tensor), name
    pd.testing.assert_frame_equal(loaded.forecast(panel), fitted.forecast(panel))


def test_round_trip_of_the_combination_keeps_its_weights_and_state(tmp_path: Path) -> None:
    panel = KeyPanel.from_demand(_noisy_demand(), top_k=3, recent=6)
    fitted = PanelForecaster(CONFIG).fit(panel, until=panel.counts.shape[1] - 4)
    save_panel_forecaster(fitted, tmp_path / "model", top_k=3, recent=6, granularity="3min")

    loaded, *_ = load_panel_forecaster(tmp_path / "model")

    assert (tmp_path / "model" / WEIGHTS_FILE).exists()  # attention is one of the experts
    assert (loaded.chosen, loaded.weights, loaded.fit_end) == (
        "adahedge",
        fitted.weights,
        fitted.fit_end,
    )
    assert loaded.current_weights(panel) == pytest.approx(fitted.current_weights(panel))
    pd.testing.assert_frame_equal(loaded.forecast(panel), fitted.forecast(panel))


def test_an_unfitted_forecaster_is_not_saved(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fit the panel forecaster before saving"):
        save_panel_forecaster(PanelForecaster(CONFIG), tmp_path, 3, 6, "3min")


# Tenant A has a __total__ (8 and 7 include unkeyed requests); tenant B has none, so its
# "other" is the sum of its unpredicted keys.
TINY = [
    ("A", "k1", 0, 3.0), ("A", "k2", 0, 1.0), ("A", TOTAL_KEY, 0, 5.0),
    ("A", "k1", 1, 4.0), ("A", "k2", 1, 2.0), ("A", "k3", 1, 1.0), ("A", TOTAL_KEY, 1, 8.0),
    ("A", "k1", 2, 6.0), ("A", TOTAL_KEY, 2, 7.0),
    ("A", "k1", 3, 5.0), ("A", "k2", 3, 1.0), ("A", TOTAL_KEY, 3, 9.0),
    ("B", "x", 0, 2.0), ("B", "y", 0, 1.0), ("B", "x", 1, 1.0),
    ("B", "x", 2, 3.0), ("B", "y", 2, 2.0), ("B", "y", 3, 4.0),
]  # fmt: skip


def _fixed_allocation(seen: list[pd.Timestamp]):
    """A predict_fn that always says A/k1 5, A/other 2, B/x 1 (and no B/other row)."""

    def predict_fn(past: DemandGrid, origin: pd.Timestamp) -> pd.DataFrame:
        seen.append(past.starts[-1])
        rows = [("A", "k1", 5.0), ("A", OTHER_KEY, 2.0), ("B", "x", 1.0)]
        frame = pd.DataFrame(
            [(t, k, "3min", s, origin + (s - 1) * WIDTH, p) for t, k, p in rows for s in (1, 2)],
            columns=["tenant", "key", "granularity", "step", "bucket_start", "predicted"],
        )
        return KeyForecast.validate(frame)

    return predict_fn


def test_evaluate_on_window_by_hand() -> None:
    # Origin t1 -> steps t1, t2; origin t2 -> t2, t3. Per (tenant, step), sum of |pred - actual|:
    #   A t1: |5-4| + |2-(8-4)| = 3    A t2: |5-6| + |2-(7-6)| = 2    A t3: |5-5| + |2-(9-5)| = 2
    #   B t1: |1-1| + |0-0| = 0        B t2: |1-3| + |0-2| = 4        B t3: |1-0| + |0-4| = 5
    # origins t1: 3, 2, 0, 4; t2: 2, 2, 4, 5 -> 22 / 8.
    seen: list[pd.Timestamp] = []
    origins = [START + WIDTH, START + 2 * WIDTH]

    mae = evaluate_on_window(_fixed_allocation(seen), demand_from_rows(TINY), origins, horizon=2)

    assert mae == pytest.approx(22 / 8)
    assert seen == [START, START + WIDTH]  # each call saw only the buckets before its origin


def test_an_allocation_by_hand_with_keys_and_tenants_the_demand_never_had() -> None:
    # From t1, 2 steps: A/k1 4, 6; A/k9 never asked; A's total 8, 7, so A/other 4, 1. B has no
    # total: B/other is B's keys less x, (1 + 0) - 1 = 0 and (3 + 2) - 3 = 2. C never asked.
    rows = [("A", "k1", 5.0), ("A", "k9", 1.0), ("A", OTHER_KEY, 2.0), ("B", "x", 1.0)]
    rows.append(("C", "z", 4.0))
    forecast = pd.DataFrame(
        [(t, k, s, p) for t, k, p in rows for s in (1, 2)],
        columns=["tenant", "key", "step", "predicted"],
    )
    actuals = WindowActuals(DemandGrid.of(demand_from_rows(TINY)))

    got = actuals.allocate(forecast, START + WIDTH, horizon=2)

    assert list(zip(got.tenants, got.keys, strict=True)) == [
        ("A", "k1"), ("A", "k9"), ("B", "x"), ("C", "z"),
        ("A", OTHER_KEY), ("B", OTHER_KEY), ("C", OTHER_KEY),
    ]  # fmt: skip
    np.testing.assert_array_equal(
        got.actual, [[4, 6], [0, 0], [1, 3], [0, 0], [4, 1], [0, 2], [0, 0]]
    )
    np.testing.assert_array_equal(got.predicted[4:], [[2, 2], [0, 0], [0, 0]])
    np.testing.assert_array_equal(got.tenant_errors(), [[4, 3], [0, 4], [4, 4]])
    assert list(got.grid_rows >= 0) == [True, False, True, False]  # k9 and C/z: no grid row
    # from t3 the second step is past the demand's last bucket: nothing came there
    np.testing.assert_array_equal(
        actuals.allocate(forecast, START + 3 * WIDTH, 2).actual[0], [5, 0]
    )
    with pytest.raises(ValueError, match="not a bucket start"):
        actuals.allocate(forecast, START + WIDTH / 2, horizon=1)
    with pytest.raises(ValueError, match="before the window's demand"):
        actuals.allocate(forecast, START - WIDTH, horizon=1)
    # a forecast the gate cannot score is refused, not scored as if its gaps were zeros
    for bad in (forecast.iloc[1:], pd.concat([forecast, forecast.iloc[:1]]), forecast.iloc[:0]):
        with pytest.raises(ValueError, match=r"one row per \(tenant, key\)|empty forecast"):
            actuals.allocate(bad, START + WIDTH, horizon=2)


def test_tail_coverage_on_the_window_by_hand() -> None:
    # Named keys A/k1 (3 requests before the window) and B/x (2): B/x is the tail. One step
    # ahead it predicts 1: within max(1, 0.5 x 1) of t1's 1, not within max(1, 1.5) of t2's 3.
    grid = DemandGrid.of(demand_from_rows(TINY))
    origins = [START + WIDTH, START + 2 * WIDTH]
    forecasts = [_fixed_allocation([])(grid.before(origin), origin) for origin in origins]
    actuals = WindowActuals(grid)

    assert tail_coverage_on_window(forecasts, actuals, origins, horizon=1) == 0.5


def test_evaluate_on_window_refuses_a_forecast_shorter_than_the_horizon() -> None:
    demand = demand_from_rows(TINY)
    with pytest.raises(ValueError, match="covers 2 steps, not 3"):
        evaluate_on_window(_fixed_allocation([]), demand, [START + WIDTH], horizon=3)


def test_the_gate_scores_a_forecast_from_the_origin_after_idle_buckets() -> None:
    # A/k1 is asked 6 in bucket 0 and nothing until 4 in bucket 3: the last value known at
    # origin 3 is bucket 2's, idle: 0. Read from the last row instead (what the gate did), the
    # forecast would say 6 for bucket 1, and was scored as if it were bucket 3's: error 2, not 4.
    rows = [("A", "k1", 0, 6.0), ("A", TOTAL_KEY, 0, 6.0), ("A", "k1", 3, 4.0)]
    rows.append(("A", TOTAL_KEY, 3, 4.0))
    demand = demand_from_rows(rows)
    last_value = PanelForecaster(CONFIG, chosen="last_value")

    mae = evaluate_on_window(_panel_predictor(last_value, 1, 1), demand, [START + 3 * WIDTH], 1)

    assert mae == pytest.approx(4.0)


def test_the_gate_refuses_a_forecast_that_does_not_start_at_its_origin() -> None:
    def from_the_last_row(past: DemandGrid, origin: pd.Timestamp) -> pd.DataFrame:
        last = past.starts[np.flatnonzero(past.dense.any(0))[-1]]  # the last bucket with a row
        panel = past.panel(top_k=1, recent=1, until=last + WIDTH)
        return PanelForecaster(CONFIG, chosen="last_value").forecast(panel)

    demand = demand_from_rows([("A", "k1", 0, 6.0), ("A", "k1", 3, 4.0)])
    with pytest.raises(ValueError, match=r"from origin .* starts at"):
        evaluate_on_window(from_the_last_row, demand, [START + 3 * WIDTH], horizon=1)


@pytest.mark.parametrize(
    ("candidate", "champion", "baseline", "promoted", "reason"),
    [
        (1.0, None, 1.0, True, "promoted: first champion"),
        (1.1, None, 1.0, False, "rejected: worse than the best per-key baseline"),
        (0.9, 1.0, 0.9, True, "promoted: beats the champion"),
        (1.0, 1.0, 1.2, False, "rejected: not better than the champion (candidate 1.0000"),
        (1.3, 1.0, 1.2, False, "not better than the champion; worse than the best per-key"),
    ],
)
def test_promotion_decision(
    candidate: float, champion: float | None, baseline: float, promoted: bool, reason: str
) -> None:
    decided, why = promotion_decision(candidate, champion, baseline)

    assert decided is promoted
    assert reason in why and "\n" not in why


@pytest.mark.parametrize(
    ("candidate", "promoted", "reason"),
    [
        ([0.5] * 8, True, "hot-set recall with the candidate 0.5000, today 0.5000, p 1.000"),
        ([0.6] * 8, True, "promoted: beats the champion"),
        ([0.5] * 7 + [0.4], True, "candidate 0.4875, today 0.5000, p 0.500"),  # 1 of 8
        ([0.4] * 8, False, "rejected: the planner's hot set recalls significantly fewer"),
        # three origins of 240 a little lower: the exact test over the 3 (not 0.042 by scipy's
        # normal approximation, counting the 237 equal ones)
        ([0.5] * 237 + [0.499] * 3, True, "p 0.125"),
        ([0.5] * 200 + [0.499] * 40, False, "significantly fewer"),
    ],
)
def test_promotion_requires_the_planner_s_hot_set_to_recall_no_fewer_requests(
    candidate: list[float], promoted: bool, reason: str
) -> None:
    hot_set = HotSetComparison(np.array(candidate), np.full(len(candidate), 0.5))

    decided, why = promotion_decision(0.9, 1.0, 0.95, hot_set)

    assert decided is promoted
    assert reason in why and "\n" not in why
    worse = promotion_decision(1.1, 1.0, 0.95, hot_set)[1]
    assert worse.startswith("rejected: not better than the champion; worse than the best")
    assert ("the planner's hot set recalls significantly fewer" in worse) is not promoted


class _Pyfunc:
    """What `Champion` reads of a loaded pyfunc: the forecaster it wraps."""

    def __init__(self, forecaster: PanelForecaster) -> None:
        self.forecaster = forecaster

    def unwrap_python_model(self) -> _Pyfunc:
        return self


def test_the_hot_set_is_compared_with_what_the_planner_runs_today() -> None:
    recall = {
        name: np.array([value])
        for name, value in (
            ("frequency", 0.5),
            ("planner_with_candidate", 0.6),
            ("planner_with_champion", 0.7),
        )
    }
    forecaster = PanelForecaster(CONFIG)
    champion = Champion("preheat-forecaster", "3", "run", {}, _Pyfunc(forecaster))

    forecaster.fit_end = "2024-03-04T06:00:00+00:00"
    pair = _hot_set_pair(recall, champion)
    assert pair is not None and (pair.candidate[0], pair.today[0]) == (0.6, 0.7)
    forecaster.fit_end = ""  # saved before 2026-12-02: the planner leaves it out of its hot set
    pair = _hot_set_pair(recall, champion)
    assert pair is not None and (pair.candidate[0], pair.today[0]) == (0.6, 0.5)
    assert _hot_set_pair(recall, None) is None and _hot_set_pair({}, champion) is None

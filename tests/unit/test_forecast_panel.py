"""Per-key forecasting: the panel of top keys + other, the per-key chooser, hot-set `preheat`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from data_contracts import KeyForecast
from models.forecast import panel as panel_module
from models.forecast.attention import AttentionConfig
from models.forecast.hotset import KeyWindows
from models.forecast.hotset_models import AttentionScorer, fine_counts
from models.forecast.panel import (
    EWMA_GRID,
    OTHER_KEY,
    DemandGrid,
    KeyPanel,
    PanelForecaster,
    baseline_levels,
    ewma_burn_in,
    tail_coverage,
)

TINY = AttentionConfig(
    scales=(1, 2, 4), context=4, horizon=2, d_model=8, heads=2, hidden=16, epochs=2
)
START = pd.Timestamp("2024-03-04T00:00:00Z")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _demand(buckets: int = 40) -> pd.DataFrame:
    """Two tenants; acme has a busy key, a quiet key and a rare one; globex one key."""
    rng = np.random.default_rng(0)
    rows = []
    for t in range(buckets):
        start = START + pd.Timedelta(minutes=3 * t)
        busy, quiet, rare, other = rng.poisson(20), rng.poisson(3), int(t % 10 == 0), rng.poisson(5)
        for key, count in (("template:busy", busy), ("template:quiet", quiet), ("prefix:7", rare)):
            if count:
                rows.append(("acme", key, start, float(count)))
        rows.append(("acme", "__total__", start, float(busy + quiet + rare)))
        rows.append(("globex", "route:/chat", start, float(other)))
        rows.append(("globex", "__total__", start, float(other)))
    frame = pd.DataFrame(rows, columns=["tenant", "key", "bucket_start", "count"])
    frame.insert(2, "granularity", "3min")
    return frame


def test_panel_keeps_top_keys_and_other_rows_sum_to_each_tenant_total() -> None:
    demand = _demand()
    panel = KeyPanel.from_demand(demand, top_k=2, recent=10)
    assert list(zip(panel.tenants, panel.keys, strict=True)) == [
        ("acme", "template:busy"),
        ("globex", "route:/chat"),
        ("acme", OTHER_KEY),
        ("globex", OTHER_KEY),
    ]
    totals = demand[demand["key"] == "__total__"].pivot_table(
        index="tenant", columns="bucket_start", values="count"
    )
    for tenant in ("acme", "globex"):
        mine = panel.counts[panel.tenants == tenant].sum(0)
        np.testing.assert_allclose(mine, totals.loc[tenant].to_numpy())
    assert panel.counts.shape == (4, 40)


def test_panel_rejects_mixed_granularities() -> None:
    demand = _demand(12)
    demand.loc[0, "granularity"] = "1h"
    demand.loc[0, "bucket_start"] = START
    with pytest.raises(ValueError, match="one granularity"):
        KeyPanel.from_demand(demand)


def test_a_panel_until_a_later_bucket_holds_the_idle_buckets_before_it() -> None:
    demand = _demand(12)
    width = pd.Timedelta(minutes=3)
    until = START + 15 * width  # buckets 12, 13 and 14 saw no request

    panel = KeyPanel.from_demand(demand, top_k=2, recent=4, until=until)
    forecast = PanelForecaster(TINY, chosen="last_value").forecast(panel)

    assert panel.counts.shape == (4, 15) and not panel.counts[:, 12:].any()
    assert panel.starts[-1] == until - width
    # the forecast starts at `until`, and predicts what the idle buckets say: nothing
    assert (forecast.loc[forecast["step"] == 1, "bucket_start"] == until).all()
    assert not forecast["predicted"].any()
    # the keys are ranked by the last 4 buckets before `until`: those of the 12th bucket only
    assert set(panel.keys) == set(KeyPanel.from_demand(demand, 2, recent=1).keys)
    for bad in (START + 11 * width, START + 14.5 * width):
        with pytest.raises(ValueError, match="must be a bucket start after"):
            KeyPanel.from_demand(demand, until=bad)


def _shuffled_demand(seed: int) -> pd.DataFrame:
    """Keys that come, go and tie, idle buckets, a tenant without totals, rows in random order."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(30):
        if t % 7 in (3, 4):
            continue  # idle
        for i in range(6):
            if rng.random() < 0.6:
                rows.append(("acme", f"k{i}", START + t * pd.Timedelta(minutes=3), rng.integers(3)))
        rows.append(("acme", "__total__", START + t * pd.Timedelta(minutes=3), 9.0))
        if t > 10:
            rows.append(("globex", f"g{t % 3}", START + t * pd.Timedelta(minutes=3), 2.0))
    frame = pd.DataFrame(rows, columns=["tenant", "key", "bucket_start", "count"])
    frame.insert(2, "granularity", "3min")
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True).astype({"count": float})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_grid_s_panel_as_of_a_bucket_is_the_panel_of_the_rows_before_it(seed: int) -> None:
    demand = _shuffled_demand(seed)
    grid = DemandGrid.of(demand)
    width = pd.Timedelta(minutes=3)
    for until in START + width * np.arange(1, 33):
        past = demand[demand["bucket_start"] < until]
        for top_k, recent in ((2, 3), (4, 48), (10, 1)):
            want = (
                KeyPanel.from_demand(past, top_k, recent, until=until)
                if until > past["bucket_start"].max()
                else KeyPanel.from_demand(past, top_k, recent)
            )
            for got in (
                grid.panel(top_k, recent, until),
                grid.before(until).panel(top_k, recent, until),
            ):
                assert list(got.tenants) == list(want.tenants)
                assert list(got.keys) == list(want.keys)
                assert got.starts.equals(want.starts)
                np.testing.assert_array_equal(got.counts, want.counts)
            # the last `history` buckets only (idle ones too), the keys chosen as without it
            for history in (1, 4, 100):
                tail = grid.panel(top_k, recent, until, history)
                assert list(tail.keys) == list(want.keys)
                assert tail.starts.equals(want.starts[-history:])
                np.testing.assert_array_equal(tail.counts, want.counts[:, -history:])
    with pytest.raises(ValueError, match="history must be at least 1"):
        grid.panel(2, 3, START + width, history=0)


def test_a_panel_is_the_same_whatever_the_rows_order() -> None:
    demand = _shuffled_demand(0)
    one = KeyPanel.from_demand(demand, top_k=3, recent=4)
    other = KeyPanel.from_demand(demand.iloc[::-1], top_k=3, recent=4)
    assert list(one.keys) == list(other.keys) and list(one.tenants) == list(other.tenants)
    np.testing.assert_array_equal(one.counts, other.counts)


def test_keys_of_equal_recent_demand_are_ranked_by_all_their_demand() -> None:
    # recent = 1: A and B both 0.2 in the last bucket (a running sum's difference made A's
    # 0.20000000000000004); B has more in all, so B is the top key
    rows = [("t", "A", 0, 0.1), ("t", "A", 1, 0.2), ("t", "B", 0, 0.3), ("t", "B", 1, 0.2)]
    frame = pd.DataFrame(rows, columns=["tenant", "key", "bucket", "count"])
    frame.insert(2, "granularity", "3min")
    frame.insert(3, "bucket_start", START + frame.pop("bucket") * pd.Timedelta(minutes=3))

    panel = KeyPanel.from_demand(frame, top_k=1, recent=1)

    assert list(panel.keys) == ["B", OTHER_KEY]


def test_no_model_can_change_the_demand_the_gate_gives_the_others() -> None:
    grid = DemandGrid.of(_demand(12))
    past = grid.before(START + 6 * pd.Timedelta(minutes=3))
    for array in (past.dense, past.volume, past.first, grid.dense):
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0


def test_the_ewma_of_a_flat_series_ties_every_alpha_and_keeps_the_smoothest() -> None:
    for level in (0.1, 1 / 3, 3.0, 7.0):
        assert PanelForecaster(TINY)._fit_alpha(np.full((2, 30), level), 30) == 0.05


def test_panel_forecaster_combines_its_experts_and_emits_the_contract() -> None:
    panel = KeyPanel.from_demand(_demand(), top_k=3, recent=10)
    model = PanelForecaster(TINY).fit(panel)
    experts = {"last_value", "moving_average", "ewma", "attention"}
    assert set(model.validation_mae) == experts | {"adahedge"} and set(model.weights) == experts
    assert model.chosen == "adahedge" and sum(model.weights.values()) == pytest.approx(1.0)
    assert model.current_weights(panel) == pytest.approx(model.weights)  # nothing new yet
    forecast = model.forecast(panel)
    KeyForecast.validate(forecast)
    assert len(forecast) == len(panel.keys) * TINY.horizon
    first = forecast[forecast["step"] == 1]["bucket_start"].unique()
    assert list(first) == [panel.starts[-1] + pd.Timedelta(minutes=3)]
    assert (forecast["predicted"] >= 0).all()


def test_panel_forecast_reads_only_buckets_before_the_origin() -> None:
    panel = KeyPanel.from_demand(_demand(), top_k=3, recent=10)
    model = PanelForecaster(TINY).fit(panel, until=30)
    before = model.forecast_counts(panel.counts, 30)
    poisoned = panel.counts.copy()
    poisoned[:, 30:] = 1e6
    np.testing.assert_allclose(model.forecast_counts(poisoned, 30), before)


def test_forecasts_from_many_origins_at_once_are_each_origin_s_forecast() -> None:
    panel = KeyPanel.from_demand(_demand(), top_k=3, recent=10)
    model = PanelForecaster(TINY).fit(panel, until=30)
    origins = np.array([31, 25, 38, 31])
    together = model.forecast_counts_at(panel.counts, origins)  # (N, K, H)
    for origin, forecast in zip(origins, together, strict=True):
        np.testing.assert_array_equal(forecast, model.forecast_counts(panel.counts, origin))
    with pytest.raises(ValueError, match="at least one origin"):
        model.forecast_counts_at(panel.counts, np.array([], dtype=np.int64))


def test_baseline_levels_at_many_origins_by_hand() -> None:
    counts = np.array([[4.0, 0.0, 8.0, 2.0, 6.0, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    origins = np.array([6, 1, 3])  # in any order

    def ewma(row: np.ndarray, origin: int) -> float:
        level = row[0]
        for value in row[1:origin]:
            level += 0.5 * (value - level)
        return level

    np.testing.assert_allclose(
        baseline_levels(counts, origins, "ewma", 0.5),
        [[ewma(row, o) for row in counts] for o in origins],
    )
    np.testing.assert_allclose(baseline_levels(counts, origins, "last_value", 0.5), [
        [1.0, 1.0], [4.0, 1.0], [8.0, 1.0]])  # fmt: skip
    np.testing.assert_allclose(baseline_levels(counts, origins, "moving_average", 0.5), [
        [np.mean([0.0, 8.0, 2.0, 6.0, 1.0]), 1.0], [4.0, 1.0], [4.0, 1.0]])  # fmt: skip
    with pytest.raises(ValueError, match="unknown panel baseline"):
        baseline_levels(counts, origins, "median", 0.5)


def test_panel_weights_go_on_learning_from_buckets_after_the_fit() -> None:
    panel = KeyPanel.from_demand(_demand(), top_k=3, recent=10)
    model = PanelForecaster(TINY).fit(panel, until=30)
    assert pd.Timestamp(model.fit_end) == panel.starts[30]
    later = model.current_weights(panel)  # buckets 30.. are actuals the fit never saw
    assert later != pytest.approx(model.weights) and sum(later.values()) == pytest.approx(1.0)
    single = PanelForecaster(TINY, chosen="ewma", alpha=0.3)
    assert single.current_weights(panel) == {"ewma": 1.0}


@pytest.mark.parametrize("chosen", ["", "ewma"])
def test_a_forecast_reads_only_its_history_and_forecasts_as_from_the_whole_panel(
    monkeypatch: pytest.MonkeyPatch, chosen: str
) -> None:
    """`history` is every bucket a forecast reads: the rounds it replays (MAX_REPLAY), the
    model's widest span before each and the EWMA's burn-in. A forecast from a panel much
    longer than that equals, to float64 rounding, the forecast that reads the whole panel."""
    panel = KeyPanel.from_demand(_demand(400), top_k=3, recent=10)
    # alpha 0.3, not the fitted 0.05: a burn-in of 103 buckets, not 717
    fitted = dataclasses.replace(PanelForecaster(TINY).fit(panel, until=300), alpha=0.3)
    model = fitted if not chosen else PanelForecaster(TINY, chosen=chosen, alpha=0.3)
    assert model.history == 48 + 2 - 1 + ewma_burn_in(0.3) == 152  # replay, horizon, burn-in
    short = model.forecast(panel)
    weights = model.current_weights(panel)
    # the buckets before the last `history` are never read: poisoned, nothing changes
    poisoned = dataclasses.replace(panel, counts=panel.counts.copy())
    poisoned.counts[:, : 400 - model.history] = np.nan
    np.testing.assert_array_equal(model.forecast(poisoned)["predicted"], short["predicted"])
    monkeypatch.setattr(PanelForecaster, "history", property(lambda self: None))
    np.testing.assert_allclose(
        short["predicted"], model.forecast(panel)["predicted"], rtol=1e-12, atol=1e-12
    )
    assert weights == pytest.approx(model.current_weights(panel), rel=1e-12)


def test_a_seasonal_forecaster_reads_the_whole_panel() -> None:
    # the phase counts from the panel's first bucket: a shorter panel would shift it
    assert PanelForecaster(dataclasses.replace(TINY, season=7)).history is None


def test_the_ewma_burn_in_leaves_its_start_under_float64_rounding() -> None:
    for alpha in (*EWMA_GRID[:-1], 0.99):  # 0.5: 0.5^53 is 2^-53 exactly, not under it
        n = ewma_burn_in(alpha)
        assert (1 - alpha) ** n < 2.0**-53 <= (1 - alpha) ** (n - 1)
    assert ewma_burn_in(1.0) == 0
    with pytest.raises(ValueError, match="alpha must be in"):
        ewma_burn_in(0.0)


def test_the_fitted_model_forecasts_each_sample_once_and_as_a_fresh_one_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forecast replays past rounds, so the gate's consecutive origins ask for the same
    samples again: each is computed once (kept by its exact input), and every forecast
    equals a fresh model's. The store is emptied at MEMO_LIMIT samples."""
    panel = KeyPanel.from_demand(_demand(), top_k=3, recent=10)
    model = PanelForecaster(TINY).fit(panel, until=20)
    computed: list[int] = []
    forward = model._forward
    monkeypatch.setattr(
        model, "_forward", lambda module, w: computed.append(len(w.last)) or forward(module, w)
    )
    rows = len(panel.keys)
    for first in range(20, 25):
        rounds = np.arange(first, first + 10)
        kept = model._predict("attention", panel.counts, rounds, model.module, model.alpha)
        fresh = dataclasses.replace(model, _memo={}, _memo_of=None)
        again = fresh._predict("attention", panel.counts, rounds, fresh.module, fresh.alpha)
        np.testing.assert_allclose(kept, again, rtol=1e-6)  # (N, K, H)
    # the first call all of its samples, each later one at most its newest round's (fewer where
    # a row's newest input equals one already seen: equal input, equal forecast)
    assert computed[0] == 10 * rows and len(computed) == 5
    assert all(0 < n <= rows for n in computed[1:])
    monkeypatch.setattr(panel_module, "MEMO_LIMIT", 2 * rows)
    model._predict("attention", panel.counts, np.arange(30, 33), model.module, model.alpha)
    assert 0 < len(model._memo) <= 3 * rows  # emptied first, then this call's samples only


def test_key_forecast_contract_rejects_negative_and_duplicate_rows() -> None:
    panel = KeyPanel.from_demand(_demand(), top_k=3, recent=10)
    forecast = PanelForecaster(TINY).fit(panel).forecast(panel)
    bad = forecast.copy()
    bad.loc[0, "predicted"] = -1.0
    with pytest.raises(Exception, match="greater_than_or_equal_to"):
        KeyForecast.validate(bad)
    with pytest.raises(Exception, match="one_row_per_key_and_step"):
        KeyForecast.validate(pd.concat([forecast, forecast.iloc[:1]], ignore_index=True))


def test_tail_coverage_counts_only_tail_keys_within_tolerance() -> None:
    volume = np.r_[np.full(19, 1.0), 1000.0]  # the last key is the head (top 5%)
    actual = np.r_[np.full(19, 4.0), 500.0]
    predicted = np.r_[np.full(10, 4.0), np.full(9, 9.0), 0.0]  # 10 of 19 tail keys right
    assert tail_coverage(predicted, actual, volume) == pytest.approx(10 / 19)
    # within max(1, 50% of actual): 5.9 is within 2 of 4, 6.5 is not
    assert (
        tail_coverage(np.array([5.9, 6.5, 0]), np.array([4.0, 4.0, 0]), np.array([1, 1, 9.0]))
        == 0.5
    )


def _windows(seed: int = 0) -> KeyWindows:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, 600, 1500))
    keys = rng.zipf(1.5, 1500) % 60
    return KeyWindows.build(times, keys, 60.0)


def test_fine_counts_reads_only_before_the_window() -> None:
    kw = _windows()
    counts = fine_counts(kw, 4, 6)
    assert counts.shape == (kw.n_keys, 24)
    assert counts.sum() == kw.before(4)
    np.testing.assert_allclose(counts.reshape(kw.n_keys, 4, 6).sum(2).T, kw.counts[:4].toarray())


def test_attention_scorer_ranks_seen_keys_and_ignores_the_future() -> None:
    kw = _windows()
    scorer = AttentionScorer(5, sub=2, config=TINY).fit(kw, until=6)
    scores = scorer.scores(kw, 7)
    seen_before = kw.counts[:7].toarray().sum(0) > 0
    assert (scores[seen_before] > 0).all() and (scores[~seen_before] == 0).all()
    with pytest.raises(ValueError, match="one window"):
        AttentionScorer(5, sub=3, config=TINY)

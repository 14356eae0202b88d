"""The warm-up planner's hot set: the hot-set combination on the lake's demand series, the
champion one of its experts and judged only on windows it was not trained on; and the plan's
hits as each key's share of the requests to come."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import DEMAND_BUCKET, DEMAND_START, demand_from_rows

import models.warmup.hot_set as hot_set_module
from data_contracts import TOTAL_KEY, RequestLog
from models.forecast.attention import AttentionConfig
from models.forecast.hotset import KeyWindows
from models.forecast.panel import PanelForecaster
from models.warmup.candidates import CandidateOptions, build_candidates
from models.warmup.hot_set import (
    FIT_WINDOWS,
    MIN_FIT_WINDOWS,
    WEIGHT_WINDOWS,
    LearnedRanker,
    hot_set,
    recall_on_window,
)

START = pd.Timestamp(DEMAND_START)
WIDTH = pd.Timedelta(DEMAND_BUCKET)
TINY = AttentionConfig(epochs=1, context=4, scales=(1, 2), horizon=2, d_model=8, heads=2)
FREQUENCY_EXPERTS = {"last_window", "ewma_frequency", "decayed_frequency"}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _demand(buckets: int, seed: int = 0) -> pd.DataFrame:
    """Two tenants at 3 min: acme's templates k0..k19 at falling rates, and `rising`, quiet
    until the last 6 buckets and then acme's busiest; globex one template. Each tenant's total
    too."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(buckets):
        counts = {f"template:k{i}": rng.poisson(10.0 / (i + 1)) for i in range(20)}
        counts["template:rising"] = 30 if t >= buckets - 6 else 0
        rows += [("acme", key, t, c) for key, c in counts.items() if c]
        rows.append(("acme", TOTAL_KEY, t, sum(counts.values())))
        rows += [("globex", "template:g", t, 4), ("globex", TOTAL_KEY, t, 4)]
    return demand_from_rows(rows)


def test_key_windows_from_counts_place_each_request_in_its_window_and_keep_empty_ones() -> None:
    kw = KeyWindows.from_counts(
        np.array([2, 0, 0]), np.array(["a", "a", "b"]), np.array([3, 2, 1]), 60.0, 100.0, 4
    )
    assert kw.counts.toarray().tolist() == [[2, 1], [0, 0], [3, 0], [0, 0]]
    assert kw.keys.tolist() == ["a", "b"] and kw.window.tolist() == [0, 0, 0, 2, 2, 2]
    assert kw.times.tolist() == [130.0] * 3 + [250.0] * 3  # mid-window, in time order
    assert kw.starts.tolist() == [100.0, 160.0, 220.0, 280.0] and kw.dropped == 0
    assert kw.before(3) == 6 and kw.row(3).sum() == 0  # the window after the data: empty
    for bad in ([4], [-1]):
        with pytest.raises(ValueError, match="every window"):
            KeyWindows.from_counts(np.array(bad), np.array(["a"]), np.array([1]), 60.0, 0.0, 4)
    with pytest.raises(ValueError, match="whole numbers"):
        KeyWindows.from_counts(np.array([0]), np.array(["a"]), np.array([0.5]), 60.0, 0.0, 4)


def test_the_shares_cover_every_keyed_request_and_rank_the_rising_key_first() -> None:
    found = hot_set(_demand(60))
    assert found is not None
    shares = found.shares.set_index(["tenant", "key"])["share"]
    assert shares.sum() == pytest.approx(1.0)
    assert TOTAL_KEY not in set(found.shares["key"])  # a tenant's total is no key to warm
    assert shares.idxmax() == ("acme", "template:rising")
    assert set(found.weights) == FREQUENCY_EXPERTS
    assert sum(found.weights.values()) == pytest.approx(1.0)
    assert found.windows == WEIGHT_WINDOWS and found.granularity == "3min"
    assert found.bucket_start == START + 60 * WIDTH  # the bucket after the demand's last
    assert found.summary()["keys"] == len(found.shares)


def test_a_history_too_short_for_the_weights_and_a_fit_gives_no_hot_set() -> None:
    enough = WEIGHT_WINDOWS + MIN_FIT_WINDOWS
    assert hot_set(_demand(enough - 1)) is None
    assert hot_set(_demand(enough)) is not None
    long = hot_set(_demand(FIT_WINDOWS + WEIGHT_WINDOWS + 50))  # older buckets are not read
    assert long is not None and long.windows == WEIGHT_WINDOWS


def test_the_shares_are_for_the_bucket_after_the_last_one_even_without_keyed_requests() -> None:
    """A last bucket whose requests had no key still ends the windows: the next window is the
    bucket the champion's forecast starts with, not one already past."""
    demand = _demand(60)
    quiet = pd.DataFrame(
        {"tenant": ["acme"], "key": [TOTAL_KEY], "granularity": ["3min"],
         "bucket_start": [START + 60 * WIDTH], "count": [2.0]}
    )  # fmt: skip
    found = hot_set(pd.concat([demand, quiet], ignore_index=True))
    assert found is not None and found.bucket_start == START + 61 * WIDTH


def test_demand_of_two_granularities_is_refused() -> None:
    demand = _demand(40)
    demand.loc[demand.index[0], "granularity"] = "1h"
    with pytest.raises(ValueError, match="one granularity"):
        hot_set(demand)


def _rotating(buckets: int) -> pd.DataFrame:
    """One tenant at 3 min: every bucket a new template gets 10 requests, and one steady
    template 1. No frequency expert can name the new one; a model that foresees it can."""
    rows = []
    for t in range(buckets):
        rows += [("acme", f"template:new{t}", t, 10), ("acme", "template:steady", t, 1)]
        rows.append(("acme", TOTAL_KEY, t, 11))
    return demand_from_rows(rows)


def _forecasts(origins: pd.DatetimeIndex, key_at, lag: int = 0) -> list[pd.DataFrame]:
    """A forecast per origin naming `key_at(t)` (t: the origin's bucket) for its first step,
    which is the origin's bucket, or `lag` buckets before it (a stale forecast)."""
    return [
        pd.DataFrame(
            {
                "tenant": ["acme"] * 2,
                "key": [key_at((o - START) // WIDTH), "__other__"],
                "step": [1, 1],
                "bucket_start": [o - lag * WIDTH] * 2,
                "predicted": [10.0, 1.0],
            }
        )
        for o in origins
    ]


def test_the_gate_credits_the_planner_with_a_model_that_names_the_next_hot_key() -> None:
    demand = _rotating(30)
    origins = pd.date_range(START + 20 * WIDTH, periods=10, freq=WIDTH)
    forecasts = {
        "foreseeing": _forecasts(origins, lambda t: f"template:new{t}"),
        "blind": _forecasts(origins, lambda t: "template:never"),
        # the right keys, but forecast for the bucket before: it foresees nothing of the origin's
        "stale": _forecasts(origins, lambda t: f"template:new{t}", lag=1),
    }

    by_origin = recall_on_window(demand, forecasts, origins, k=1)
    assert {len(values) for values in by_origin.values()} == {len(origins)}  # paired by origin
    recall = {name: values.mean() for name, values in by_origin.items()}

    assert recall["frequency"] <= 1 / 11  # at best the steady template's 1 request of 11
    assert recall["foreseeing"] == pytest.approx(10 / 11)
    assert recall["blind"] == recall["stale"] == 0.0
    # every origin but the first, where the weights are even and the others name new{t-1}
    assert recall["planner_with_foreseeing"] == pytest.approx(9 / 10 * 10 / 11)
    assert recall["planner_with_blind"] == pytest.approx(recall["frequency"])
    assert recall["planner_with_stale"] == pytest.approx(recall["frequency"])
    # the window is what was seen before each origin: a later bucket's rows change nothing
    later = demand_from_rows([("acme", "template:late", 40, 99)])
    with_later = pd.concat([demand, later], ignore_index=True)
    again = recall_on_window(with_later, forecasts, origins, k=1)
    assert {name: values.tolist() for name, values in again.items()} == {
        name: values.tolist() for name, values in by_origin.items()
    }


def test_the_gate_weighs_the_last_origins_as_the_planner_does(monkeypatch) -> None:
    """A model that foresees the hot key for 30 origins and then names one never asked for: a
    planner remembering every origin keeps trusting it longer than one weighing the last 24."""
    demand = _rotating(90)
    origins = pd.date_range(START + 10 * WIDTH, periods=80, freq=WIDTH)
    turncoat = {"turncoat": _forecasts(origins, lambda t: f"template:new{t}" if t < 40 else "x")}

    planner = recall_on_window(demand, turncoat, origins, k=1)["planner_with_turncoat"]
    monkeypatch.setattr(hot_set_module, "WEIGHT_WINDOWS", 10**6)
    remembering = recall_on_window(demand, turncoat, origins, k=1)["planner_with_turncoat"]

    assert planner.mean() > remembering.mean()


def test_the_gate_refuses_a_hot_set_it_cannot_judge() -> None:
    demand = _rotating(30)
    origins = pd.date_range(START + 20 * WIDTH, periods=3, freq=WIDTH)
    one = {"model": _forecasts(origins, lambda t: "template:steady")}
    with pytest.raises(ValueError, match="consecutive buckets"):
        recall_on_window(demand, one, origins[[0, 2]])
    with pytest.raises(ValueError, match="2 forecasts for 3 origins"):
        recall_on_window(demand, {"model": one["model"][:2]}, origins)
    early = pd.date_range(START + (MIN_FIT_WINDOWS - 1) * WIDTH, periods=3, freq=WIDTH)
    with pytest.raises(ValueError, match=f"fewer than {MIN_FIT_WINDOWS}"):
        recall_on_window(demand, one, early)
    totals = demand[demand["key"] == TOTAL_KEY]
    with pytest.raises(ValueError, match="no requests of named keys"):
        recall_on_window(totals, one, origins)
    assert hot_set(totals) is None  # nor has the planner a hot set to rank by
    old_keys = demand[(demand["key"] == TOTAL_KEY) | (demand["bucket_start"] < START + WIDTH)]
    far = pd.date_range(START + (FIT_WINDOWS + 5) * WIDTH, periods=3, freq=WIDTH)
    later = demand_from_rows([("acme", TOTAL_KEY, t, 11) for t in range(30, FIT_WINDOWS + 9)])
    with pytest.raises(ValueError, match="no request of a named key from"):
        recall_on_window(pd.concat([old_keys, later], ignore_index=True), one, far)
    idle = demand[(demand["key"] == TOTAL_KEY) | (demand["bucket_start"] < origins[0])]
    with pytest.raises(ValueError, match="no request of a named key at any origin"):
        recall_on_window(idle, one, origins)


def _ranker(demand: pd.DataFrame, trained_buckets: int) -> LearnedRanker:
    from models.forecast.panel import KeyPanel

    panel = KeyPanel.from_demand(demand, top_k=5, recent=10)
    forecaster = PanelForecaster(TINY).fit(panel, until=trained_buckets)
    forecast = forecaster.forecast(panel)  # what the planner's `load_forecast` gives it
    return LearnedRanker(forecaster, 5, 10, "preheat-forecaster v7", forecast)


def test_the_champion_is_weighed_only_on_windows_after_its_training() -> None:
    demand = _demand(60)
    trained_now = hot_set(demand, _ranker(demand, 60))  # trained on every bucket: no evidence
    assert trained_now is not None
    assert set(trained_now.weights) == FREQUENCY_EXPERTS | {"champion"}
    assert trained_now.windows == 0
    assert list(trained_now.weights.values()) == pytest.approx([0.25] * 4)  # even
    ten_ago = hot_set(demand, _ranker(demand, 50))
    assert ten_ago is not None and ten_ago.windows == 10
    assert list(ten_ago.weights.values()) != pytest.approx([0.25] * 4)
    assert ten_ago.shares["share"].sum() == pytest.approx(1.0)


def test_a_champion_that_cannot_forecast_the_demand_is_left_out_with_a_note() -> None:
    demand = _demand(60)
    ranker = _ranker(demand, 50)
    corrupt = dataclasses.replace(ranker.forecaster, fit_end="not a time")
    broken = dataclasses.replace(ranker, forecaster=corrupt)
    found = hot_set(demand, broken)
    assert found is not None and set(found.weights) == FREQUENCY_EXPERTS
    assert found.notes and found.notes[0].startswith("champion preheat-forecaster v7 left out")


def test_a_champion_saved_without_the_end_of_its_training_is_left_out() -> None:
    """Models saved before 2026-12-02 have no `fit_end`: no window is known to be unseen."""
    demand = _demand(60)
    ranker = _ranker(demand, 50)
    legacy = dataclasses.replace(
        ranker, forecaster=dataclasses.replace(ranker.forecaster, fit_end="")
    )
    found = hot_set(demand, legacy)
    assert found is not None and set(found.weights) == FREQUENCY_EXPERTS
    assert "without the end of its training" in found.notes[0]


def test_a_champion_forecast_of_another_bucket_is_left_out() -> None:
    """The next window takes the planner's forecast as made: it must be of that window."""
    demand = _demand(60)
    ranker = _ranker(demand, 50)
    late = ranker.forecast.assign(bucket_start=ranker.forecast["bucket_start"] + WIDTH)
    found = hot_set(demand, dataclasses.replace(ranker, forecast=late))
    assert found is not None and set(found.weights) == FREQUENCY_EXPERTS
    assert "does not start at the next bucket" in found.notes[0]


def test_for_past_windows_the_champion_names_only_the_keys_it_named_before_them() -> None:
    """It names its top K by recent demand: a key hot only in the windows the weights learn
    from must not be named for them, or the champion would be credited with foreseeing it."""
    demand = _demand(60)
    ranker = _ranker(demand, 50)
    cutoff = START + WIDTH * 54  # `rising` is hot from bucket 54 on
    now, before = ranker.panel(demand), ranker.panel(demand, named_before=cutoff)
    assert "template:rising" in set(now.keys) and "template:rising" not in set(before.keys)
    assert before.starts.equals(now.starts)  # every bucket, so any origin can be forecast
    row = {name: i for i, name in enumerate(before.keys)}, {n: i for i, n in enumerate(now.keys)}
    k0 = "template:k0"
    np.testing.assert_array_equal(before.counts[row[0][k0]], now.counts[row[1][k0]])


def test_expected_counts_are_rounded_to_requests() -> None:
    """`DemandSeries` allows any count >= 0 (a resampled trace's expected counts)."""
    demand = _demand(60)
    demand["count"] = demand["count"] * 0.5 + 0.25
    found = hot_set(demand)
    assert found is not None and found.shares["share"].sum() == pytest.approx(1.0)


def _requests(demand: pd.DataFrame) -> pd.DataFrame:
    """One request per key of the last bucket, each template on its own blocks."""
    last = demand[(demand["bucket_start"] == demand["bucket_start"].max())]
    last = last[last["key"] != TOTAL_KEY].reset_index(drop=True)
    rows = [
        {
            "timestamp": row.bucket_start + pd.Timedelta(seconds=90), "tenant": row.tenant,
            "request_id": f"r{i}", "session_id": f"s{i}", "prompt": f"prompt {i}",
            "prompt_tokens": 64, "output_tokens": 8,
            "prefix_hashes": [100 * i + 1, 100 * i + 2, 100 * i + 3],
            "template_id": str(row.key).removeprefix("template:"), "route": "/v1/chat",
            "latency_ms": 100.0, "priority": 5,
        }
        for i, row in enumerate(last.itertuples())
    ]  # fmt: skip
    return RequestLog.validate(pd.DataFrame(rows))


def test_the_plans_hits_are_each_keys_share_of_the_forecast_volume() -> None:
    demand = _demand(60)
    found = hot_set(demand)
    assert found is not None
    now = demand["bucket_start"].max() + WIDTH
    volume = [100.0, 300.0]  # every row of the forecast, per step
    forecast = pd.DataFrame(
        {
            "tenant": ["acme", "acme", "globex", "globex"],
            "key": ["template:k0", "__other__"] * 2,
            "granularity": "3min", "step": [1, 2, 1, 2],
            "bucket_start": [now, now + WIDTH] * 2,
            "predicted": [volume[0] / 2, volume[1] / 2] * 2,
        }
    )  # fmt: skip
    requests = _requests(demand)
    options = CandidateOptions(window_s=600.0)
    candidates = build_candidates(
        requests, forecast, demand, now=now, options=options, hot=found.shares
    )
    hits = candidates.groupby(["tenant", "key"], observed=True)["predicted_hits"].max()
    shares = found.shares.set_index(["tenant", "key"])["share"]
    for (tenant, key), value in hits.items():
        assert value == pytest.approx(shares[(tenant, key)] * sum(volume)), key
    assert set(candidates["source"]) == {"hotset"}
    without = build_candidates(requests, None, demand, now=now, options=options, hot=found.shares)
    assert set(without["source"]) == {"hotset"}  # the volume from the heat instead

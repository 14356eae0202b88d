"""The drift check's logic: features, contract, windows, and Evidently's decision on generated
traffic that did or did not change (rate, token lengths, template mix)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pandera.errors
import pytest

from data_contracts.drift import DRIFT_COLUMNS, DriftFeatures
from models.drift import (
    COLUMN_THRESHOLDS,
    DRIFT,
    INSUFFICIENT,
    MIN_REQUESTS,
    NO_DRIFT,
    OTHER_TEMPLATES,
    TrainingWindow,
    between,
    choose_windows,
    collapse_templates,
    detect_drift,
    request_features,
    same_time_of_day,
    write_reports,
)
from models.ingest.synthetic import SyntheticLogSpec, generate_requests

START = pd.Timestamp("2024-03-04T00:00:00Z")


def requests_of(spec: SyntheticLogSpec) -> pd.DataFrame:
    frame = pd.DataFrame(generate_requests(spec))
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame


def day(seed: int, requests_per_day: int = 15_000) -> pd.DataFrame:
    """One generated day without bursts (a burst *is* a template-mix shift)."""
    return requests_of(
        SyntheticLogSpec(days=1, requests_per_day=requests_per_day, bursts=0, seed=seed)
    )


def hour(features: pd.DataFrame, at: int) -> pd.DataFrame:
    start = START + pd.Timedelta(hours=at)
    return between(features, start, start + pd.Timedelta(hours=1))


@pytest.fixture(scope="module")
def reference_day() -> pd.DataFrame:
    return request_features(day(seed=21))


@pytest.fixture(scope="module")
def other_day() -> pd.DataFrame:
    return day(seed=22)


# -- features and contract ------------------------------------------------------------------


def small_requests() -> pd.DataFrame:
    stamps = ["00:00:01", "00:00:04", "00:00:09", "00:00:12"]
    return pd.DataFrame(
        {
            "timestamp": pd.to_datetime([f"2024-03-04T{s}Z" for s in stamps]),
            "tenant": ["acme", "acme", "globex", "acme"],
            "prompt_tokens": [10, 20, 30, 40],
            "output_tokens": [1, 2, 3, 4],
            "template_id": ["t1", None, "t1", "t2"],
            "prompt": "unused columns are ignored",
        }
    ).iloc[::-1]  # out of order: the features come back in time order


def test_features_are_one_row_per_request_with_its_buckets_rate() -> None:
    features = request_features(small_requests())
    assert list(features.columns) == ["timestamp", *DRIFT_COLUMNS]
    assert features["prompt_tokens"].tolist() == [10, 20, 30, 40]
    # three requests in [00:00:00, 00:00:10), one in the next 10 s bucket
    assert features["rate_rps"].tolist() == pytest.approx([0.3, 0.3, 0.3, 0.1])
    assert features["template"].tolist() == ["acme/t1", "acme/-", "globex/t1", "acme/t2"]


def test_features_name_a_missing_column() -> None:
    with pytest.raises(ValueError, match=r"missing: \['template_id'\]"):
        request_features(small_requests().drop(columns="template_id"))


def test_features_reject_a_negative_token_count_naming_column_check_and_row() -> None:
    bad = small_requests()
    bad.loc[bad["prompt_tokens"] == 30, "prompt_tokens"] = -5
    with pytest.raises(pandera.errors.SchemaErrors) as caught:
        request_features(bad)
    case = caught.value.failure_cases.iloc[0]
    assert (case["column"], case["check"], case["failure_case"]) == (
        "prompt_tokens", "greater_than_or_equal_to(0)", -5,
    )  # fmt: skip
    assert case["index"] == 2  # the third request in time order


def test_contract_rejects_a_zero_rate_and_an_extra_column() -> None:
    features = request_features(small_requests())
    with pytest.raises(pandera.errors.SchemaErrors, match="greater_than"):
        DriftFeatures.validate(features.assign(rate_rps=0.0), lazy=True)
    with pytest.raises(pandera.errors.SchemaErrors, match="column_in_schema"):
        DriftFeatures.validate(features.assign(latency_ms=1.0), lazy=True)


def test_templates_outside_the_references_top_become_other() -> None:
    reference = pd.DataFrame({"template": ["a/1"] * 3 + ["a/2"] * 2 + ["a/3"]})
    current = pd.DataFrame({"template": ["a/3", "a/9", "a/1"]})
    ref, cur = collapse_templates(reference, current, top=2)
    assert ref["template"].tolist() == ["a/1"] * 3 + ["a/2"] * 2 + [OTHER_TEMPLATES]
    assert cur["template"].tolist() == [OTHER_TEMPLATES, OTHER_TEMPLATES, "a/1"]


# -- windows ---------------------------------------------------------------------------------


def test_same_time_of_day_keeps_only_that_hour_of_each_day_even_across_midnight() -> None:
    reference = pd.DataFrame({"timestamp": pd.date_range(START, periods=3 * 24 * 6, freq="10min")})
    late = same_time_of_day(
        reference, START + pd.Timedelta("23h30min"), START + pd.Timedelta("24h30min")
    )
    minutes = late["timestamp"].dt.hour * 60 + late["timestamp"].dt.minute
    assert ((minutes >= 23 * 60 + 30) | (minutes < 30)).all() and len(late) == 3 * 6


def test_without_a_champion_the_reference_is_the_oldest_window(reference_day: pd.DataFrame) -> None:
    windows = choose_windows(reference_day, 60, None, "no preheat-forecaster@champion registered")
    assert not windows.problem
    assert windows.reference["timestamp"].max() < START + pd.Timedelta(hours=1)
    assert windows.current["timestamp"].min() >= START + pd.Timedelta(hours=23)
    assert windows.source == "oldest 60 min of the lake (no preheat-forecaster@champion registered)"


def test_a_short_lake_cuts_the_reference_where_the_current_window_starts(
    reference_day: pd.DataFrame,
) -> None:
    windows = choose_windows(between(reference_day, START, START + pd.Timedelta("90min")), 60, None)
    assert not windows.problem and windows.source.endswith(
        ", cut to the 30 min before the current window"
    )
    assert windows.reference["timestamp"].max() < START + pd.Timedelta("30min")
    assert windows.current["timestamp"].min() >= START + pd.Timedelta("30min")
    one_window = choose_windows(hour(reference_day, 10), 60, None)
    assert one_window.problem == (
        "the lake holds no more than one 60-min window of requests: "
        "nothing before the current window to compare it with"
    )


def test_a_champion_window_of_days_is_aligned_to_the_current_time_of_day(
    reference_day: pd.DataFrame, other_day: pd.DataFrame
) -> None:
    later = request_features(
        other_day.assign(timestamp=other_day["timestamp"] + pd.Timedelta(days=1))
    )
    lake = pd.concat([reference_day, later[later["timestamp"] < START + pd.Timedelta("1 day 15h")]])
    training = TrainingWindow(START, START + pd.Timedelta(days=1), "preheat-forecaster v1 (run r)")
    windows = choose_windows(lake, 60, training)
    assert windows.reference["timestamp"].dt.hour.unique().tolist() == [14]
    assert windows.current["timestamp"].dt.hour.unique().tolist() == [14]
    assert "at the current window's time of day (14:00-15:00 UTC)" in windows.source
    gone = TrainingWindow(START - pd.Timedelta(days=9), START - pd.Timedelta(days=8), "v0")
    fallback = choose_windows(lake, 60, gone)
    assert fallback.source.startswith("oldest 60 min of the lake (v0: no requests of its training")
    short = TrainingWindow(START, START + pd.Timedelta(hours=12), "v2")
    unaligned = choose_windows(lake, 60, short)
    assert len(unaligned.reference) == len(between(lake, short.start, short.end))
    assert (
        unaligned.source
        == "v2 training window (less than a day: all of it, not aligned to the time of day)"
    )


# -- decisions --------------------------------------------------------------------------------


@pytest.mark.parametrize("at", [10, 15, 21])
def test_no_drift_between_two_days_of_the_same_generator(
    reference_day: pd.DataFrame, other_day: pd.DataFrame, at: int
) -> None:
    result = detect_drift(hour(reference_day, at), hour(request_features(other_day), at))
    assert result.decision == NO_DRIFT, result.reason
    assert result.share_drifted == 0.0 and result.drifted_columns == ()
    assert result.reason.startswith("0 of 4 columns drifted (share 0.00 < threshold 0.25)")
    assert [c.column for c in result.columns] == list(DRIFT_COLUMNS)


def test_longer_prompts_are_drift_in_prompt_tokens_only(
    reference_day: pd.DataFrame, other_day: pd.DataFrame
) -> None:
    longer = other_day.assign(prompt_tokens=(other_day["prompt_tokens"] * 1.25).astype(int))
    result = detect_drift(hour(reference_day, 15), hour(request_features(longer), 15))
    assert result.decision == DRIFT and result.drifted_columns == ("prompt_tokens",)
    assert result.share_drifted == 0.25
    assert "prompt_tokens Wasserstein distance (normed)" in result.reason
    assert "(mean 136 -> 169, +25%)" in result.reason  # by how much, in the user's units


def test_a_reshuffled_template_popularity_is_drift_in_the_template_mix(
    reference_day: pd.DataFrame, other_day: pd.DataFrame
) -> None:
    # the popular templates become the rare ones: t000 -> t020, t001 -> t021, ...
    rotated = other_day["template_id"].map(lambda t: f"t{(int(t[1:]) + 20) % 40:03d}")
    result = detect_drift(
        hour(reference_day, 15), hour(request_features(other_day.assign(template_id=rotated)), 15)
    )
    assert result.decision == DRIFT and result.drifted_columns == ("template",)
    assert f"largest change {OTHER_TEMPLATES}" in result.reason


@pytest.mark.slow
def test_a_doubled_arrival_rate_is_drift_in_the_rate(reference_day: pd.DataFrame) -> None:
    busier = request_features(day(seed=23, requests_per_day=30_000))
    result = detect_drift(hour(reference_day, 15), hour(busier, 15))
    assert result.decision == DRIFT and result.drifted_columns == ("rate_rps",)
    rate = next(c for c in result.columns if c.column == "rate_rps")
    assert rate.score >= 2 * COLUMN_THRESHOLDS["rate_rps"]


def test_the_threshold_is_a_share_of_drifted_columns(
    reference_day: pd.DataFrame, other_day: pd.DataFrame
) -> None:
    shifted = other_day.assign(
        prompt_tokens=other_day["prompt_tokens"] * 2, output_tokens=other_day["output_tokens"] * 2
    )
    current = hour(request_features(shifted), 15)
    lenient = detect_drift(hour(reference_day, 15), current, threshold=0.75)
    assert lenient.decision == NO_DRIFT and lenient.share_drifted == 0.5
    assert lenient.drifted_columns == ("prompt_tokens", "output_tokens")
    assert lenient.reason.startswith("2 of 4 columns drifted (share 0.50 < threshold 0.75): ")
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        detect_drift(hour(reference_day, 15), current, threshold=0)


def test_too_few_requests_is_an_outcome_not_a_crash(reference_day: pd.DataFrame) -> None:
    current = hour(reference_day, 15).head(50)
    result = detect_drift(hour(reference_day, 14), current)
    assert result.decision == INSUFFICIENT and not result.drift and result.columns == ()
    assert result.reason == f"not enough requests in the current window: 50 < {MIN_REQUESTS}"


def test_reports_are_written_and_agree_with_the_result(
    reference_day: pd.DataFrame, other_day: pd.DataFrame, tmp_path: Path
) -> None:
    longer = other_day.assign(prompt_tokens=other_day["prompt_tokens"] * 2)
    result = detect_drift(hour(reference_day, 15), hour(request_features(longer), 15))
    written = write_reports(result, tmp_path)
    assert sorted(p.name for p in written) == ["report.html", "report.json", "result.json"]
    decision = json.loads((tmp_path / "result.json").read_text())
    assert decision["decision"] == DRIFT and decision["drifted_columns"] == ["prompt_tokens"]
    assert [c["column"] for c in decision["columns"] if c["drifted"]] == ["prompt_tokens"]
    evidently = json.loads((tmp_path / "report.json").read_text())
    scores = {
        m["config"]["column"]: m["value"]
        for m in evidently["metrics"]
        if m["config"]["type"].endswith(":ValueDrift")
    }
    assert scores == pytest.approx({c.column: c.score for c in result.columns})
    assert "<html" in (tmp_path / "report.html").read_text()[:2000].lower()

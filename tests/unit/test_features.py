"""Demand features: key precedence, bucket alignment, conservation of counts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from data_contracts import RequestLog
from data_contracts.derived import read_demand, require_demand, write_demand
from data_contracts.lake import Lake
from models.features.demand import TOTAL_KEY, demand_keys, demand_series
from models.ingest.pipeline import ingest_file


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"tenant": "acme", "session_id": "s", "prompt": None, "prompt_tokens": 1,
            "output_tokens": 1, "prefix_hashes": None, "template_id": None, "route": None,
            "latency_ms": None, "priority": 5}  # fmt: skip
    records = [{**base, "request_id": f"r{i}", **row} for i, row in enumerate(rows)]
    out = pd.DataFrame(records)
    out["timestamp"] = pd.to_datetime(out["timestamp"], utc=True)
    return RequestLog.validate(out[list(RequestLog.to_schema().columns)])


def test_key_precedence_template_then_prefix_then_route() -> None:
    requests = frame(
        [
            {
                "timestamp": "2024-03-04T00:00:00Z",
                "template_id": "t1",
                "prefix_hashes": [9],
                "route": "/a",
            },
            {"timestamp": "2024-03-04T00:00:01Z", "prefix_hashes": [-9, 4], "route": "/a"},
            {"timestamp": "2024-03-04T00:00:02Z", "route": "/a"},
            {"timestamp": "2024-03-04T00:00:03Z"},
        ]
    )
    keys = demand_keys(requests)
    assert keys.tolist()[:3] == ["template:t1", "prefix:-9", "route:/a"]
    assert pd.isna(keys.iloc[3])


def test_buckets_are_aligned_and_counts_conserved() -> None:
    times = ["2024-03-04T00:00:04Z", "2024-03-04T00:00:05Z", "2024-03-04T00:02:59Z",
             "2024-03-04T00:03:00Z", "2024-03-04T01:00:00Z"]  # fmt: skip
    requests = frame([{"timestamp": t, "template_id": "t1"} for t in times])
    series = demand_series(requests)
    five = series["5s"]
    assert five.loc[five["key"] == "template:t1", "count"].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]
    three = series["3min"].query("key == 'template:t1'")
    assert three["bucket_start"].dt.strftime("%H:%M").tolist() == ["00:00", "00:03", "01:00"]
    assert three["count"].tolist() == [3.0, 1.0, 1.0]
    for granularity, table in series.items():
        assert table.loc[table["key"] == TOTAL_KEY, "count"].sum() == len(times), granularity
        assert table.loc[table["key"] != TOTAL_KEY, "count"].sum() == len(times), granularity


def test_unkeyed_requests_count_only_in_total() -> None:
    requests = frame([{"timestamp": "2024-03-04T00:00:00Z"}, {"timestamp": "2024-03-04T00:00:00Z"}])
    hourly = demand_series(requests)["1h"]
    assert hourly[["key", "count"]].values.tolist() == [[TOTAL_KEY, 2.0]]


def test_tenants_never_share_a_series() -> None:
    requests = frame(
        [
            {"timestamp": "2024-03-04T00:00:00Z", "template_id": "t1"},
            {"timestamp": "2024-03-04T00:00:00Z", "template_id": "t1", "tenant": "other"},
        ]
    )
    hourly = demand_series(requests)["1h"]
    assert hourly.query("key == 'template:t1'").groupby("tenant")["count"].sum().to_dict() == {
        "acme": 1.0,
        "other": 1.0,
    }


def test_generated_log_end_to_end_features(small_log: Path, lake: Lake, tmp_path: Path) -> None:
    ingest_file(small_log, lake)
    series = demand_series(lake.read("requests"))
    features = tmp_path / "features"
    for granularity, table in series.items():
        write_demand(features, granularity, table)
    back = read_demand(features, "3min")
    pd.testing.assert_frame_equal(back, series["3min"])
    assert read_demand(features, "5s")["count"].sum() == 2 * lake.count("requests")


def test_write_demand_rejects_mixed_granularity(tmp_path: Path) -> None:
    requests = frame([{"timestamp": "2024-03-04T00:00:00Z", "template_id": "t1"}])
    with pytest.raises(ValueError, match="granularities other than '1h'"):
        write_demand(tmp_path, "1h", demand_series(requests)["5s"])
    with pytest.raises(ValueError, match="unknown granularity"):
        read_demand(tmp_path, "2s")
    assert read_demand(tmp_path, "1h").empty


def test_models_learn_from_the_lake_s_latest_period(tmp_path: Path) -> None:
    """A trace ingested at its default epoch two months before the live traffic must not leave
    the models a calendar of zeros; a silence under a day (a quiet night) keeps both sides."""
    times = ["2024-01-01T00:00:00Z", "2024-01-01T00:04:00Z", "2024-03-04T08:00:00Z",
             "2024-03-05T04:00:00Z", "2024-03-05T04:03:00Z"]  # fmt: skip
    requests = frame([{"timestamp": t, "template_id": "t1"} for t in times])
    write_demand(tmp_path / "features", "3min", demand_series(requests)["3min"])
    kept = require_demand(tmp_path, "3min")
    assert kept["bucket_start"].min() == pd.Timestamp("2024-03-04T08:00:00Z")
    assert kept[kept["key"] == TOTAL_KEY]["count"].sum() == 3
    every = read_demand(tmp_path / "features", "3min")
    assert every[every["key"] == TOTAL_KEY]["count"].sum() == 5  # the lake keeps all of it

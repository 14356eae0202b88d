"""Data tests of the contracts: good frames pass, each kind of bad frame fails precisely."""

from __future__ import annotations

import pandas as pd
import pandera.errors
import pytest

from data_contracts import (
    CONTRACT_VERSION,
    DemandSeries,
    QuarantineRow,
    RequestLog,
    failures_by_row,
)


def request_frame(n: int = 3, **overrides: object) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "timestamp": pd.date_range("2024-03-04", periods=n, freq="s", tz="UTC"),
            "tenant": "acme",
            "request_id": [f"r{i}" for i in range(n)],
            "session_id": "s1",
            "prompt": [None] + ["hello"] * (n - 1),
            "prompt_tokens": 10,
            "output_tokens": 5,
            "prefix_hashes": [[1, 2, 3]] * n,
            "template_id": None,
            "route": "/v1/chat/completions",
            "latency_ms": 12.5,
            "priority": 5,
        }
    )
    for column, value in overrides.items():
        frame[column] = value
    return frame


def only_failure(model: type, frame: pd.DataFrame) -> tuple[str, str, object]:
    """(column, check, row index) of the single failure pandera reports."""
    with pytest.raises(pandera.errors.SchemaErrors) as caught:
        model.validate(frame, lazy=True)
    cases = caught.value.failure_cases
    located = cases[cases["index"].notna()] if cases["index"].notna().any() else cases
    first = located.iloc[0]
    return first["column"], first["check"], first["index"]


def test_contract_version_is_semver_like() -> None:
    major, minor = CONTRACT_VERSION.split(".")
    assert major.isdigit() and minor.isdigit()


def test_good_request_log_passes_and_is_typed() -> None:
    out = RequestLog.validate(request_frame())
    assert str(out["timestamp"].dtype) == "datetime64[ns, UTC]"
    assert str(out["prefix_hashes"].dtype) == "list<item: int64>[pyarrow]"
    assert out["prompt"].isna().sum() == 1


@pytest.mark.parametrize(
    ("column", "value", "check"),
    [
        ("prompt_tokens", -1, "greater_than_or_equal_to(0)"),
        ("output_tokens", -7, "greater_than_or_equal_to(0)"),
        ("priority", 11, "less_than_or_equal_to(10)"),
        ("priority", 0, "greater_than_or_equal_to(1)"),
        ("tenant", "", "str_length(1, 64)"),
        ("latency_ms", -0.5, "greater_than_or_equal_to(0)"),
        ("timestamp", pd.Timestamp("1999-12-31T23:59:59Z"), "greater_than_or_equal_to"),
        ("timestamp", pd.Timestamp("2100-01-01T00:00:00Z"), "less_than"),
        ("prefix_hashes", [], "prefix_hashes_not_empty"),
    ],
)
def test_bad_value_names_column_check_and_row(column: str, value: object, check: str) -> None:
    frame = request_frame()
    frame.at[1, column] = value if column != "prefix_hashes" else None
    if column == "prefix_hashes":
        frame["prefix_hashes"] = [[1], [], [2]]
    failed_column, failed_check, row = only_failure(RequestLog, frame)
    assert failed_column == column
    assert failed_check.startswith(check)
    assert row == 1


def test_duplicate_request_id_within_tenant_fails_but_other_tenant_is_fine() -> None:
    frame = request_frame(request_id=["a", "b", "a"])
    _, check, row = only_failure(RequestLog, frame)
    assert (check, row) == ("request_id_unique_per_tenant", 2)
    frame["tenant"] = ["t1", "t1", "t2"]
    RequestLog.validate(frame)


def test_extra_and_misordered_columns_are_rejected() -> None:
    with pytest.raises(pandera.errors.SchemaErrors, match="column 'extra' not in DataFrameSchema"):
        RequestLog.validate(request_frame().assign(extra=1), lazy=True)
    reordered = request_frame()[["tenant", *[c for c in request_frame() if c != "tenant"]]]
    with pytest.raises(pandera.errors.SchemaErrors, match="out-of-order"):
        RequestLog.validate(reordered, lazy=True)


def test_wrong_type_fails_coercion() -> None:
    column, check, row = only_failure(RequestLog, request_frame(prompt_tokens=["1", "x", "3"]))
    assert (column, row) == ("prompt_tokens", 1)
    assert "coerce_dtype('int64')" in check or "dtype('int64')" in check


def test_failures_by_row_splits_good_from_bad_with_reasons() -> None:
    frame = request_frame(5)
    frame.loc[1, "prompt_tokens"] = -3
    frame.loc[3, "priority"] = 42
    good, failures = failures_by_row(RequestLog, frame)
    assert list(good["request_id"]) == ["r0", "r2", "r4"]
    reasons = {f.index: f.reason for f in failures}
    assert reasons == {
        1: "prompt_tokens: failed greater_than_or_equal_to(0) (value -3)",
        3: "priority: failed less_than_or_equal_to(10) (value 42)",
    }


def test_failures_by_row_handles_coercion_then_value_failures() -> None:
    frame = request_frame(4)
    frame["output_tokens"] = ["5", "many", "-2", "7"]
    good, failures = failures_by_row(RequestLog, frame)
    assert list(good["request_id"]) == ["r0", "r3"]
    reasons = {f.index: f.reason for f in failures}
    assert reasons[1] == "output_tokens: failed coerce_dtype('int64') (value 'many')"
    assert reasons[2] == "output_tokens: failed greater_than_or_equal_to(0) (value -2)"


def test_failures_by_row_raises_on_missing_column() -> None:
    with pytest.raises(pandera.errors.SchemaErrors, match="route"):
        failures_by_row(RequestLog, request_frame().drop(columns="route"))


def demand_frame(**overrides: object) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "tenant": "acme",
            "key": ["template:t1", "template:t1", "__total__"],
            "granularity": "3min",
            "bucket_start": pd.to_datetime(
                ["2024-03-04T00:00:00Z", "2024-03-04T00:03:00Z", "2024-03-04T00:00:00Z"]
            ),
            "count": [3.0, 1.0, 4.0],
        }
    )
    for column, value in overrides.items():
        frame[column] = value
    return frame


def test_good_demand_series_passes() -> None:
    assert len(DemandSeries.validate(demand_frame())) == 3


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"count": [3.0, -1.0, 4.0]}, ("count", "greater_than_or_equal_to(0)", 1)),
        ({"granularity": ["3min", "7min", "3min"]}, ("granularity", "isin", 1)),
        (
            {
                "bucket_start": pd.to_datetime(
                    ["2024-03-04T00:00:00Z", "2024-03-04T00:04:00Z", "2024-03-04T00:00:00Z"]
                )
            },
            (None, "bucket_start_aligned_to_granularity", 1),
        ),
        (
            {
                "key": ["template:t1", "template:t1", "template:t1"],
                "bucket_start": pd.Timestamp("2024-03-04T00:00:00Z"),
            },
            (None, "one_row_per_bucket", 1),
        ),
    ],
)
def test_bad_demand_series(overrides: dict, expected: tuple) -> None:
    column, check, row = only_failure(DemandSeries, demand_frame(**overrides))
    want_column, want_check, want_row = expected
    assert check.startswith(want_check)
    assert row == want_row
    if want_column is not None:
        assert column == want_column


def test_quarantine_row_contract() -> None:
    good = pd.DataFrame(
        {
            "source": ["/logs/a.jsonl"],
            "row_number": [7],
            "raw": ["{not json"],
            "raw_bytes": [9],
            "reason": ["not valid JSON: unexpected character"],
            "quarantined_at": [pd.Timestamp("2024-03-04T00:00:00Z")],
        }
    )
    QuarantineRow.validate(good)
    assert only_failure(QuarantineRow, good.assign(reason=[""]))[:2] == (
        "reason",
        "str_length(1, None)",
    )
    assert only_failure(QuarantineRow, good.assign(row_number=[-1]))[0] == "row_number"

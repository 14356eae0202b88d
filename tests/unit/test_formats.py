"""Code tests of the source formats, readers and format detection."""

from __future__ import annotations

from pathlib import Path

import orjson
import pandas as pd
import pytest

from data_contracts import RequestLog
from models.ingest.detect import resolve_format
from models.ingest.formats import (
    Azure,
    FastPathMiss,
    Mooncake,
    ServeGen,
    SourceContext,
    parse_iso_utc,
    relative_to_epoch,
)
from models.ingest.formats_generic import Generic, parse_timestamps
from models.ingest.pipeline import SLOW_PATH_ROWS, process_chunk
from models.ingest.readers import InputError, RowError, read_byte_lines

CTX = SourceContext(source="/logs/trace.jsonl", tenant="acme")


def mooncake_line(
    ts: float = 1000, inp: object = 600, out: object = 7, ids: object = None
) -> bytes:
    return orjson.dumps(
        {
            "timestamp": ts,
            "input_length": inp,
            "output_length": out,
            "hash_ids": [1, 2] if ids is None else ids,
        }
    )


def test_derived_ids_are_stable_and_distinguish_name_line_and_content() -> None:
    a = CTX.derived_id("mooncake", 3, b"x")
    assert a == SourceContext(source="/other/dir/trace.jsonl").derived_id("mooncake", 3, b"x")
    assert a != CTX.derived_id("mooncake", 4, b"x")
    assert a != CTX.derived_id("mooncake", 3, b"y")
    assert a != SourceContext(source="/logs/other.jsonl").derived_id("mooncake", 3, b"x")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (mooncake_line(inp="600"), "input_length: expected integer, got str"),
        (mooncake_line(inp=600.0), "input_length: expected integer, got float"),
        (mooncake_line(out=True), "output_length: expected integer, got bool"),
        (mooncake_line(ids=[1, "2"]), "hash_ids: expected list of integers"),
        (mooncake_line(ids=[2**63]), "hash_ids: hash outside the signed 64-bit range"),
        (mooncake_line(ts="0"), "timestamp: expected number of ms, got str"),
        (b'{"timestamp": 1, "input_length": 5}', "fields: missing ['hash_ids', 'output_length']"),
        (
            b'{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1], "x": 0}',
            "fields: unexpected ['x']",
        ),
        (b'{"timestamp": 1, "input_le', "not valid JSON: unexpected end of data"),
        (b"[1, 2, 3]", "not a JSON object: list"),
        (b"\xff\xfe\x00garbage", "binary data: NUL byte in line"),
    ],
)
def test_mooncake_rejects_with_reason(line: bytes, reason: str) -> None:
    with pytest.raises(RowError) as caught:
        Mooncake().parse(line, 1, line, CTX)
    assert str(caught.value).startswith(reason)


def test_mooncake_fast_path_refuses_what_the_slow_path_rejects() -> None:
    bad_lines = [
        mooncake_line(inp="600"),
        mooncake_line(inp=6.5),
        b'{"timestamp": 1}',
        mooncake_line(ids=[1, True]),
        mooncake_line() + b" " + mooncake_line(),
    ]  # fmt: skip
    for bad in bad_lines:
        with pytest.raises(FastPathMiss):
            Mooncake().fast_frame([1, 2], [mooncake_line(), bad], CTX)


def test_fast_and_slow_paths_produce_the_same_rows() -> None:
    lines = [
        mooncake_line(ts=i * 10, inp=100 + i, ids=[i, i + 1] if i % 3 else []) for i in range(50)
    ]
    records = [(i + 1, line, line) for i, line in enumerate(lines)]
    fast = RequestLog.validate(Mooncake().fast_frame([r[0] for r in records], lines, CTX))
    slow_rows = [Mooncake().parse(line, n, line, CTX) for n, line, _ in records]
    slow = pd.DataFrame.from_records(
        slow_rows, columns=Mooncake.columns, index=[r[0] for r in records]
    )
    slow = RequestLog.validate(Mooncake().finalize(slow, CTX))
    pd.testing.assert_frame_equal(fast, slow)
    assert fast["prefix_hashes"].isna().sum() == 17  # empty hash lists become null


def azure_frames(lines: list[bytes]) -> tuple[pd.DataFrame, pd.DataFrame]:
    numbers = list(range(2, len(lines) + 2))
    fast = RequestLog.validate(Azure().fast_frame(numbers, lines, CTX))
    rows = [
        Azure().parse(line.decode().split(","), n, line, CTX)
        for n, line in zip(numbers, lines, strict=True)
    ]
    slow = pd.DataFrame.from_records(rows, columns=Azure.columns, index=numbers)
    return fast, RequestLog.validate(Azure().finalize(slow, CTX))


def test_azure_fast_and_slow_paths_agree() -> None:
    lines = [b"2023-11-16 18:17:03.9799600,4808,10", b"2023-11-16 18:17:04.0319600,3180,8"]
    fast, slow = azure_frames(lines)
    pd.testing.assert_frame_equal(fast, slow)


def test_azure_reads_the_2023_and_2024_traces_timestamps_as_utc() -> None:
    """2023 writes 7 fractional digits and no zone; 2024 (written by pandas) ends in "+00:00"
    and drops a zero fraction. Both were quarantined whole before: every row, no series."""
    lines = [
        b"2024-05-10 00:00:00.009930+00:00,2162,5",
        b"2024-05-10 00:00:01+00:00,4808,10",
        b"2023-11-16 18:17:03.9799600,3180,8",
        b"2023-11-16 18:17:04,100,1",
    ]
    fast, slow = azure_frames(lines)
    pd.testing.assert_frame_equal(fast, slow)
    assert fast["timestamp"].tolist() == [
        pd.Timestamp("2024-05-10 00:00:00.00993Z"),
        pd.Timestamp("2024-05-10 00:00:01Z"),
        pd.Timestamp("2023-11-16 18:17:03.97996Z"),
        pd.Timestamp("2023-11-16 18:17:04Z"),
    ]


def test_a_row_without_an_offset_is_utc_whatever_the_row_before_it() -> None:
    """pandas 2.3, asked to parse both kinds in one call, gave the second row the first one's
    "+02:00": 10:00 became 08:00 UTC, a request moved two hours without a word."""
    got = parse_timestamps(pd.Series(["2024-03-04T12:00:00+02:00", "2024-03-04 10:00:00"]))
    assert got.tolist() == [pd.Timestamp("2024-03-04T10:00:00Z")] * 2
    assert parse_iso_utc(pd.Series(["2024-03-04", "2024-03-04T10:00-0130"])).tolist() == [
        pd.Timestamp("2024-03-04T00:00:00Z"),  # a bare date's "-04" is not an offset
        pd.Timestamp("2024-03-04T11:30:00Z"),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        b"2023-11-16 18:17:03,4.5,1",
        b"2023-11-16 18:17:03,,1",
        b"2023-11-16 18:17:03,1,2,3",
        b"2023-11-16 18:17:03,1",
    ],
)
def test_azure_fast_path_misses_on_rows_it_cannot_vouch_for(bad: bytes) -> None:
    with pytest.raises(FastPathMiss):
        Azure().fast_frame([2, 3], [b"2023-11-16 18:17:03.9799600,4808,10", bad], CTX)


def test_azure_quoted_field_is_treated_alike_on_both_paths() -> None:
    quoted = [b'"2023-11-16 18:17:03.9799600",4808,10']
    fast = Azure().fast_frame([2], quoted, CTX)
    slow_row = Azure().parse(quoted[0].decode().split(","), 2, quoted[0], CTX)
    slow = Azure().finalize(pd.DataFrame([slow_row], columns=Azure.columns, index=[2]), CTX)
    assert fast["timestamp"].isna().all() and slow["timestamp"].isna().all()  # both quarantine


def test_chunk_with_bad_rows_bisects_and_keeps_good_rows_on_fast_path() -> None:
    lines = [mooncake_line(ts=i) for i in range(SLOW_PATH_ROWS * 4)]
    lines[700] = b"{broken"
    records = [(i + 1, line, line) for i, line in enumerate(lines)]
    result = process_chunk(Mooncake(), records, CTX)
    assert len(result.good) == len(lines) - 1
    assert list(result.quarantine["row_number"]) == [701]


def test_relative_to_epoch_marks_out_of_range_as_nat() -> None:
    epoch = pd.Timestamp("2024-01-01T00:00:00Z")
    got = relative_to_epoch(pd.Series([0, 1500, 1e30, float("nan"), -5]), epoch, 1_000_000)
    assert got[0] == epoch and got[1] == epoch + pd.Timedelta(milliseconds=1500)
    assert got[2] is pd.NaT and got[3] is pd.NaT
    assert got[4] == epoch - pd.Timedelta(milliseconds=5)


def test_parse_timestamps_accepts_iso_and_epoch_seconds() -> None:
    got = parse_timestamps(
        pd.Series(["2024-03-04T10:00:00Z", "2024-03-04 10:00:00", 1709546400, "x", None])
    )
    expected = pd.Timestamp("2024-03-04T10:00:00Z")
    assert list(got[:3]) == [expected] * 3
    assert got[3] is pd.NaT and got[4] is pd.NaT


def test_generic_rejects_unknown_fields_and_missing_required() -> None:
    fmt = Generic("jsonl")
    with pytest.raises(RowError, match=r"unknown fields \['promt'\]"):
        fmt.parse(
            b'{"timestamp": 1, "prompt_tokens": 1, "output_tokens": 1, "promt": "x"}', 1, b"", CTX
        )
    with pytest.raises(RowError, match="output_tokens: missing"):
        fmt.parse(b'{"timestamp": 1, "prompt_tokens": 1}', 1, b"", CTX)
    with pytest.raises(RowError, match="tenant: expected string, got int"):
        fmt.parse(
            b'{"timestamp": 1, "prompt_tokens": 1, "output_tokens": 1, "tenant": 5}', 1, b"", CTX
        )


def test_generic_fills_defaults() -> None:
    row = Generic("jsonl").parse(
        b'{"timestamp": 1, "prompt_tokens": 2, "output_tokens": 3}', 9, b"r", CTX
    )
    record = dict(zip(Generic.columns, row, strict=True))
    assert record["tenant"] == "acme" and record["priority"] == 5
    assert record["request_id"] == CTX.derived_id("jsonl", 9, b"r") == record["session_id"]


def test_azure_and_servegen_rows() -> None:
    row = Azure().parse(["2023-11-16 18:17:03.9799600", "4808", "10"], 2, b"", CTX)
    assert row[5:7] == (4808, 10)
    with pytest.raises(RowError, match="ContextTokens: expected integer"):
        Azure().parse(["2023-11-16 18:17:03", "4.5", "10"], 2, b"", CTX)
    assert ServeGen().parse(["600", "1.5", "55"], 3, b"", CTX) == (
        "acme",
        "__total__",
        "10min",
        600,
        900.0,
    )
    with pytest.raises(RowError, match="not a multiple of 600"):
        ServeGen().parse(["601", "1.5", "55"], 3, b"", CTX)
    with pytest.raises(RowError, match="expected finite number"):
        ServeGen().parse(["600", "inf", "55"], 3, b"", CTX)


def test_byte_lines_skip_blank_lines_and_cap_long_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"a\n\n   \nb" + b"c" * 100 + b"\nd\r\n")
    rows = list(read_byte_lines(path, max_line_bytes=50))
    assert [r[0] for r in rows] == [1, 4, 5]
    assert isinstance(rows[1][1], RowError) and "line too long: 102 bytes > 50" in str(rows[1][1])
    assert rows[2][1] == b"d"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("a.jsonl", mooncake_line(), "mooncake"),
        ("a.jsonl", b'{"question": "who?", "answer": ["me"]}', "prompts"),
        ("a.jsonl", b'{"timestamp": 1, "prompt_tokens": 1, "output_tokens": 1}', "jsonl"),
        ("a.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n", "azure"),
        ("a.csv", b"window_start_s,total_rate_rps,active_clients\n", "servegen"),
        ("a.csv", b"act,prompt\nx,y\n", "prompts"),
    ],
)
def test_auto_detection(tmp_path: Path, name: str, content: bytes, expected: str) -> None:
    path = tmp_path / name
    path.write_bytes(content + b"\n")
    assert resolve_format(path, "auto").name == expected


@pytest.mark.parametrize(
    ("name", "content", "fmt", "message"),
    [
        ("a.txt", b"x", "auto", "unknown file type .txt"),
        ("a.jsonl", b"", "auto", "empty file"),
        ("a.jsonl", b"not json", "auto", "first line is not JSON"),
        ("a.csv", b"foo,bar\n1,2\n", "auto", "cannot tell the format from CSV header"),
        ("a.jsonl", b"{}", "parquetish", "unknown format 'parquetish'"),
    ],
)
def test_detection_errors(
    tmp_path: Path, name: str, content: bytes, fmt: str, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        resolve_format(path, fmt)


def test_wrong_csv_header_for_explicit_format(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("window_start_s,total_rate_rps,active_clients\n0,1,2\n")
    with pytest.raises(InputError, match="expected CSV header TIMESTAMP,ContextTokens"):
        list(Azure().records(path))
    with pytest.raises(InputError, match="no such file"):
        resolve_format(tmp_path / "missing.csv", "azure")


def generic_frames(lines: list[bytes]) -> tuple[pd.DataFrame, pd.DataFrame]:
    numbers = list(range(1, len(lines) + 1))
    fast = RequestLog.validate(Generic("jsonl").fast_frame(numbers, lines, CTX))
    rows = [
        Generic("jsonl").parse(line, n, line, CTX) for n, line in zip(numbers, lines, strict=True)
    ]
    slow = pd.DataFrame.from_records(rows, columns=Generic.columns, index=numbers)
    return fast, RequestLog.validate(Generic("jsonl").finalize(slow, CTX))


@pytest.mark.parametrize(
    "lines",
    [
        [
            b'{"timestamp": "2024-03-04T00:00:00Z", "tenant": "a", "request_id": "r1",'
            b' "session_id": "s", "prompt": "hi", "prompt_tokens": 3, "output_tokens": 1,'
            b' "prefix_hashes": [1, -2], "template_id": "t", "route": "/x", "latency_ms": 12,'
            b' "priority": 9}',
            b'{"timestamp": "2024-03-04 00:00:01", "prompt_tokens": 3, "output_tokens": 1,'
            b' "priority": null}',
        ],
        [
            b'{"timestamp": 1709510400, "prompt_tokens": 3, "output_tokens": 1}',
            b'{"timestamp": 1709510400.5, "prompt_tokens": 4, "output_tokens": 2,'
            b' "request_id": "x"}',
        ],
    ],
)
def test_generic_fast_and_slow_paths_agree(lines: list[bytes]) -> None:
    fast, slow = generic_frames(lines)
    pd.testing.assert_frame_equal(fast, slow, check_dtype=False)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"timestamp": 1, "prompt_tokens": "3", "output_tokens": 1}',
        b'{"timestamp": 1, "prompt_tokens": 3.5, "output_tokens": 1}',
        b'{"timestamp": 1, "prompt_tokens": 3}',
        b'{"timestamp": 1, "prompt_tokens": 3, "output_tokens": 1, "extra": 0}',
        b'{"timestamp": 1, "prompt_tokens": 3, "output_tokens": 1, "tenant": 7}',
        b'{"timestamp": true, "prompt_tokens": 3, "output_tokens": 1}',
    ],
)
def test_generic_fast_path_misses_what_parse_must_judge(bad: bytes) -> None:
    good = b'{"timestamp": 1, "prompt_tokens": 3, "output_tokens": 1}'
    with pytest.raises(FastPathMiss):
        Generic("jsonl").fast_frame([1, 2], [good, bad], CTX)

"""Data tests of file ingestion: the invariants on good, corrupted and re-ingested files."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from data_contracts import QuarantineRow, RequestLog
from data_contracts.lake import Lake
from models.ingest.faults import CORRUPTIONS, corrupt_jsonl
from models.ingest.pipeline import ingest_file
from models.ingest.readers import InputError


def test_mooncake_like_trace_is_accepted_whole(mooncake_like: Path, lake: Lake) -> None:
    report = ingest_file(mooncake_like, lake, "mooncake")
    assert (report.read, report.accepted, report.quarantined) == (1200, 1200, 0)
    stored = RequestLog.validate(lake.read("requests"))
    assert len(stored) == 1200
    assert stored["prefix_hashes"].notna().all()


def test_generated_log_round_trips_every_field(small_log: Path, lake: Lake) -> None:
    report = ingest_file(small_log, lake)
    assert report.format == "jsonl" and report.quarantined == 0
    first = orjson.loads(small_log.read_bytes().splitlines()[0])
    stored = lake.read("requests").set_index("request_id").loc[first["request_id"]]
    assert stored["tenant"] == first["tenant"]
    assert list(stored["prefix_hashes"]) == first["prefix_hashes"]
    assert stored["template_id"] == first["template_id"]
    assert stored["latency_ms"] == pytest.approx(first["latency_ms"])


def test_corrupted_copy_keeps_invariant_and_says_why(
    mooncake_like: Path, lake: Lake, tmp_path: Path
) -> None:
    bad = tmp_path / "corrupted.jsonl"
    kinds = corrupt_jsonl(mooncake_like, bad, fraction=0.05, seed=1)
    assert set(kinds.values()) == set(CORRUPTIONS)
    report = ingest_file(bad, lake, "mooncake", chunk_rows=500)
    assert report.accepted + report.quarantined == report.read == 1200
    assert report.quarantined == len(kinds)
    quarantine = QuarantineRow.validate(lake.read("quarantine"))
    assert (
        dict(zip(quarantine["row_number"], quarantine["reason"], strict=True)).keys()
        == kinds.keys()
    )
    expected_reason = {
        "truncated": ("not valid JSON",),
        "binary": ("not valid UTF-8", "binary data: NUL byte"),
        "wrong_type": ("expected integer, got str",),
        "negative": ("failed greater_than_or_equal_to(0)",),
        "timestamp": ("timestamp: unparseable or out of range",),
        "huge": ("line too long",),
    }
    for row in quarantine.itertuples():
        assert any(e in row.reason for e in expected_reason[kinds[row.row_number]]), row.reason
        assert row.raw_bytes >= len(row.raw.encode()) or kinds[row.row_number] == "binary"
    huge = quarantine[quarantine["reason"].str.startswith("line too long")]
    assert (huge["raw_bytes"] <= 64 * 1024).all()  # the 10 MB line is capped, not stored whole


def test_reingest_adds_nothing(mooncake_like: Path, lake: Lake, tmp_path: Path) -> None:
    bad = tmp_path / "corrupted.jsonl"
    corrupt_jsonl(mooncake_like, bad, fraction=0.05, seed=2)
    first = ingest_file(bad, lake, "mooncake")
    second = ingest_file(bad, lake, "mooncake")
    assert (second.read, second.accepted, second.quarantined) == (
        first.read,
        first.accepted,
        first.quarantined,
    )
    assert second.written == 0 and second.duplicates == second.accepted
    assert lake.count("requests") == first.accepted
    assert len(lake.read("quarantine")) == first.quarantined


def test_grown_log_adds_only_new_lines(mooncake_like: Path, lake: Lake, tmp_path: Path) -> None:
    lines = mooncake_like.read_bytes().splitlines()
    log = tmp_path / "growing.jsonl"
    log.write_bytes(b"\n".join(lines[:700]) + b"\n")
    assert ingest_file(log, lake, "mooncake").written == 700
    log.write_bytes(b"\n".join(lines) + b"\n")
    assert ingest_file(log, lake, "mooncake").written == 500
    assert lake.count("requests") == 1200


def test_crash_mid_file_loses_nothing_reported(mooncake_like: Path, lake: Lake) -> None:
    reported: list[int] = []

    def crash_after_second_chunk(report) -> None:
        reported.append(report.accepted)
        if len(reported) == 2:
            raise KeyboardInterrupt("process killed")

    with pytest.raises(KeyboardInterrupt):
        ingest_file(
            mooncake_like, lake, "mooncake", chunk_rows=300, on_chunk=crash_after_second_chunk
        )
    assert len(lake.read("requests")) == reported[-1] == 600
    again = ingest_file(mooncake_like, lake, "mooncake", chunk_rows=300)
    assert (again.written, again.duplicates) == (600, 600)
    assert lake.read("requests")["request_id"].is_unique and lake.count("requests") == 1200


def test_rows_repeated_inside_a_file_are_duplicates_not_errors(tmp_path: Path, lake: Lake) -> None:
    line = (
        b'{"timestamp": "2024-03-04T00:00:00Z", "request_id": "r1",'
        b' "prompt_tokens": 1, "output_tokens": 1}'
    )
    log = tmp_path / "repeats.jsonl"
    log.write_bytes(line + b"\n" + line + b"\n")
    report = ingest_file(log, lake)
    assert (report.read, report.accepted, report.quarantined, report.duplicates) == (2, 2, 0, 1)
    assert lake.count("requests") == 1


def test_servegen_windows_become_demand_rows(tmp_path: Path, lake: Lake) -> None:
    log = tmp_path / "rate.csv"
    log.write_text(
        "window_start_s,total_rate_rps,active_clients\n0,2.5,3\n600,-1,3\n1200,x,3\n1800,1,3\n"
    )
    report = ingest_file(log, lake, "servegen")
    assert (report.table, report.read, report.accepted, report.quarantined) == ("demand", 4, 2, 2)
    demand = lake.read("demand")
    assert list(demand["count"]) == [1500.0, 600.0]
    assert set(lake.read("quarantine")["row_number"]) == {3, 4}  # the header is line 1


def test_csv_generic_and_prompts_formats(tmp_path: Path, lake: Lake) -> None:
    log = tmp_path / "log.csv"
    log.write_text(
        "timestamp,tenant,prompt_tokens,output_tokens,prefix_hashes,latency_ms\n"
        '2024-03-04T00:00:00Z,acme,10,2,"[1, 2]",12.5\n'
        "2024-03-04T00:00:01Z,acme,ten,2,,\n"
    )
    report = ingest_file(log, lake)
    assert (report.format, report.accepted, report.quarantined) == ("jsonl", 1, 1)
    assert list(lake.read("requests")["prefix_hashes"][0]) == [1, 2]
    prompts = tmp_path / "prompts.csv"
    prompts.write_text('act,prompt\nAnalyst,"Summarise this\nfiling please"\nEmpty,\n')
    report = ingest_file(prompts, lake, "prompts")
    assert (report.accepted, report.quarantined) == (1, 1)
    stored = lake.read("requests")
    assert stored.loc[stored["prompt"].notna(), "prompt_tokens"].iloc[0] > 0


def test_unreadable_input_raises_input_error(tmp_path: Path, lake: Lake) -> None:
    with pytest.raises(InputError, match="no such file"):
        ingest_file(tmp_path / "nope.jsonl", lake)
    corrupt = tmp_path / "bad.parquet"
    corrupt.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        ingest_file(corrupt, lake)


def test_parquet_generic_log(tmp_path: Path, lake: Lake) -> None:
    import pandas as pd

    log = tmp_path / "log.parquet"
    pd.DataFrame(
        {
            "timestamp": ["2024-03-04T00:00:00Z", "2024-03-04T00:00:01Z", "yesterday"],
            "request_id": ["a", "b", "c"],
            "prompt_tokens": [3, 4, 5],
            "output_tokens": [1, 1, 1],
        }
    ).to_parquet(log)
    report = ingest_file(log, lake)
    assert (report.read, report.accepted, report.quarantined) == (3, 2, 1)
    assert lake.read("quarantine")["reason"].iloc[0] == "timestamp: unparseable or out of range"


def test_invalid_first_copy_does_not_hide_a_valid_second(tmp_path: Path, lake: Lake) -> None:
    log = tmp_path / "copies.jsonl"
    log.write_text(
        '{"timestamp": 1709510400, "request_id": "x", "prompt_tokens": -1, "output_tokens": 1}\n'
        '{"timestamp": 1709510400, "request_id": "x", "prompt_tokens": 5, "output_tokens": 1}\n'
    )
    report = ingest_file(log, lake)
    assert (report.accepted, report.quarantined, report.duplicates) == (1, 1, 0)
    assert lake.read("requests")["prompt_tokens"].tolist() == [5]


def test_empty_hash_list_means_no_blocks_and_bad_lines_never_abort(
    tmp_path: Path, lake: Lake
) -> None:
    head = b'{"timestamp": 1709510400, "prompt_tokens": 3, "output_tokens": 4'
    lines = [head + b', "request_id": "r%d"}' % i for i in range(300)]
    lines.append(head + b', "prefix_hashes": []}')  # no full block: stored as null
    lines.append(head + b', "latency_ms": NaN}')  # Arrow reads NaN; JSON has none
    lines.append(head + b', "prefix_hashes": [1, null]}')
    lines.append(head + b', "prompt": "ab\xff"}')  # invalid UTF-8
    log = tmp_path / "edge.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    report = ingest_file(log, lake)
    assert report.read == 304 and report.accepted + report.quarantined == 304
    stored = lake.read("requests")  # the lake stays readable
    assert len(stored) == 301 and stored["prefix_hashes"].isna().all()
    assert len(lake.read("quarantine")) == report.quarantined == 3


def test_parquet_in_the_contracts_own_schema(tmp_path: Path, lake: Lake) -> None:
    import pandas as pd

    log = tmp_path / "typed.parquet"
    pd.DataFrame(
        {
            "timestamp": pd.to_datetime(["2024-03-04T00:00:00Z", "2024-03-04T00:00:01Z"]),
            "request_id": ["a", "b"],
            "prompt_tokens": [3, 4],
            "output_tokens": [1, 1],
        }
    ).to_parquet(log)
    report = ingest_file(log, lake)
    assert (report.accepted, report.quarantined) == (2, 0)

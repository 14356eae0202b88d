"""The lake's promises: deduplicated appends, crash safety, and safety across processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pandas as pd
import pytest

from data_contracts import RequestLog
from data_contracts.lake import Lake


def requests(ids: list[str], tenant: str = "acme", day: str = "2024-03-04") -> pd.DataFrame:
    n = len(ids)
    frame = pd.DataFrame(
        {
            "timestamp": pd.date_range(f"{day}T23:59:58Z", periods=n, freq="s"),
            "tenant": tenant,
            "request_id": ids,
            "session_id": "s",
            "prompt": "p",
            "prompt_tokens": 1,
            "output_tokens": 1,
            "prefix_hashes": [[7, 8]] * n,
            "template_id": None,
            "route": None,
            "latency_ms": None,
            "priority": 5,
        }
    )
    return RequestLog.validate(frame)


def test_append_partitions_by_date_and_reads_back(lake: Lake) -> None:
    result = lake.append("requests", requests(["a", "b", "c", "d"]))
    assert (result.written, result.duplicates) == (4, 0)
    partitions = sorted(p.parent.name for p in lake.files("requests"))
    assert partitions == ["date=2024-03-04", "date=2024-03-05"]
    back = lake.read("requests")
    assert sorted(back["request_id"]) == ["a", "b", "c", "d"]
    RequestLog.validate(back)  # what comes out meets the contract that went in
    assert lake.count("requests") == 4


def test_append_skips_rows_already_present(lake: Lake) -> None:
    lake.append("requests", requests(["a", "b"]))
    result = lake.append("requests", requests(["b", "c", "a", "d"]))
    assert (result.written, result.duplicates) == (2, 2)
    assert sorted(lake.read("requests")["request_id"]) == ["a", "b", "c", "d"]
    assert lake.append("requests", requests(["c"])).written == 0
    # the same id under another tenant is another request
    assert lake.append("requests", requests(["c"], tenant="other")).written == 1


def test_append_refuses_wrong_columns(lake: Lake) -> None:
    with pytest.raises(ValueError, match="columns"):
        lake.append("requests", requests(["a"]).drop(columns="route"))


def test_crash_after_commit_before_publish_is_finished_by_next_reader(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(self: Lake, path: Path) -> None:
        raise KeyboardInterrupt("killed between commit and rename")

    monkeypatch.setattr(Lake, "_publish", crash)
    with pytest.raises(KeyboardInterrupt):
        lake.append("requests", requests(["a", "b"]))
    monkeypatch.undo()
    assert list(lake.pending.glob("*.parquet"))  # committed but not yet visible
    reopened = Lake(lake.root)
    assert sorted(reopened.read("requests")["request_id"]) == ["a", "b"]
    assert not list(lake.pending.glob("*.parquet"))
    assert reopened.append("requests", requests(["a", "b"])).written == 0


def test_crash_before_commit_leaves_nothing_and_retry_writes(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Lake._write_pending

    def write_then_die(self: Lake, table: str, batch: str, rows: pd.DataFrame) -> list[Path]:
        original(self, table, batch, rows)
        raise OSError("disk full after writing the pending file")

    monkeypatch.setattr(Lake, "_write_pending", write_then_die)
    with pytest.raises(OSError, match="disk full"):
        lake.append("requests", requests(["a", "b"]))
    monkeypatch.undo()
    assert lake.read("requests").empty and lake.count("requests") == 0
    assert not list(lake.pending.glob("*.parquet"))
    assert lake.append("requests", requests(["a", "b"])).written == 2


def test_orphan_pending_file_of_dead_writer_is_discarded(lake: Lake) -> None:
    orphan = lake.pending / "requests__date=2024-03-04__deadbeef.parquet"
    orphan.write_bytes(b"half-written")
    assert lake.read("requests").empty
    assert not orphan.exists()


def _append_worker(root: str, ids: list[str], barrier: multiprocessing.Barrier) -> int:
    lake = Lake(Path(root))
    barrier.wait()
    return lake.append("requests", requests(ids)).written


@pytest.mark.slow
def test_concurrent_writers_in_processes_never_duplicate(tmp_path: Path) -> None:
    Lake(tmp_path)  # create the index before the race
    ids = [f"r{i}" for i in range(300)]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(3)
        with context.Pool(3) as pool:
            written = pool.starmap(_append_worker, [(str(tmp_path), ids, barrier)] * 3)
    assert sorted(written) == [0, 0, 300]
    back = Lake(tmp_path).read("requests")
    assert len(back) == 300 and back["request_id"].is_unique


def test_publish_tolerates_a_peer_having_published_first(lake: Lake) -> None:
    frame = requests(["a"])
    (pending,) = lake._write_pending("requests", "cafe", frame)
    lake._publish(pending)  # a peer's _recover got there first ...
    lake._publish(pending)  # ... so the writer's own publish finds the file already moved
    assert [p.name for p in lake.files("requests")] == ["part-cafe.parquet"]
    with pytest.raises(FileNotFoundError):
        lake._publish(lake.pending / "requests__date=2024-03-04__gone.parquet")

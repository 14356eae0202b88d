"""`benchmarks/robustness.py` (issue 21 part 5): one JSON object on a tiny generated trace, skipped
entries (not tracebacks) without the shared data, one line and exit 2 on a bad flag. No timings."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import orjson
import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "robustness.py"


@pytest.fixture(scope="module")
def robustness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("robustness_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPT.parent))  # the script imports its sibling by name
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def robustness_cache(robustness: ModuleType) -> ModuleType:
    return importlib.import_module("robustness_cache")  # imported by the script, cached


def write_lirs(path: Path, n: int = 3000, seed: int = 0) -> None:
    """A small LIRS trace (one block number per line, gzipped) with a skewed popularity."""
    rng = np.random.default_rng(seed)
    keys = rng.zipf(1.2, n) % 600
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("\n".join(map(str, keys.tolist())).encode()))


def test_quick_cache_on_a_generated_trace(
    robustness: ModuleType,
    robustness_cache: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_lirs(tmp_path / "cache_traces" / "lirs" / "multi2.trace.gz")
    assert robustness.main(["--quick", "--only", "cache", "--shared", str(tmp_path)]) == 0
    out = orjson.loads(capsys.readouterr().out)
    cells = out["cache"]["traces"]["multi2.trace.gz"]["cells"]
    assert set(cells) == {"0.05", "0.1"}
    for cell in cells.values():
        assert 0 <= cell["preheat"] <= cell["Belady"] + 1e-9
        assert cell["best_online_policy"] != "Belady"
        assert cell["ratio_to_best_online"] == pytest.approx(
            cell["preheat"] / cell["best_online"], abs=1e-3
        )
        assert cell["margin_to_best_member"] == pytest.approx(
            cell["preheat"] - cell["best_member_hits"], abs=1e-4
        )
    short = out["cache_short_cells"]
    assert short["of_cells"] == 2
    assert short["short"] == sum(
        c["margin_to_best_online"] < -robustness_cache.CACHE_TOLERANCE for c in cells.values()
    )
    worst = out["worst"]["cache_ratio_to_best_online"]
    assert worst["ratio_to_best_online"] == min(c["ratio_to_best_online"] for c in cells.values())
    assert worst["where"].startswith("multi2.trace.gz @ ")
    assert isinstance(out["goals"]["cache_never_below_lru"], bool)
    replay = out["goals"]["replay_at_least_200k_per_s"]
    trace = out["cache"]["traces"]["multi2.trace.gz"]
    assert replay["slowest_trace"] == "multi2.trace.gz"
    assert replay["slowest_req_per_s"] == trace["req_per_s"] > 0
    assert replay["slowest_trace_lru_req_per_s"] == trace["lru_req_per_s"] > 0
    assert "seconds" in out and "seconds" in out["cache"]


def test_pool_members_alone_are_each_candidate_replayed_on_its_own(
    robustness_cache: ModuleType,
) -> None:
    """On a loop a bit larger than the cache LRU hits nothing and LIRS keeps most of it: each
    member's figure is its own replay, not the pool's."""
    from cache_runtime.candidates import CANDIDATES
    from cache_runtime.traces import AccessTrace

    accesses = np.tile(np.arange(130), 30)
    trace = AccessTrace("loop", accesses, np.arange(len(accesses)))
    members = robustness_cache.pool_members_alone(trace, 100)
    assert set(members) == set(CANDIDATES)
    assert members["lru"] == 0.0
    assert members["lirs"] > 0.5


def test_members_read_from_the_bench_row_equal_their_own_replays(
    robustness_cache: ModuleType,
) -> None:
    """The candidates `bench cache` already replays alone are taken from its row: the same
    figures as replaying them here."""
    from cache_runtime.traces import AccessTrace
    from models.evaluation.bench.cache_bench import bench_cache

    rng = np.random.default_rng(4)
    accesses = rng.zipf(1.2, 4000) % 700
    trace = AccessTrace("zipf", accesses, np.arange(len(accesses)))
    row = bench_cache(trace, [0.1])["sizes"]["0.1"]
    replayed = robustness_cache.pool_members_alone(trace, row["capacity"])
    assert robustness_cache.pool_members_alone(trace, row["capacity"], row) == replayed
    assert set(robustness_cache.IN_BENCH_ROW) < set(replayed)


def test_short_cells_are_split_by_whether_a_member_alone_was_good_enough(
    robustness_cache: ModuleType,
) -> None:
    def cell(preheat: float, member: float, best: float = 0.5) -> dict[str, float]:
        return {"margin_to_best_online": round(preheat - best, 4), "best_online": best,
                "best_member_hits": member}  # fmt: skip

    traces = {
        "a": {"cells": {"0.05": cell(0.45, 0.499), "0.1": cell(0.45, 0.45), "0.2": cell(0.5, 0.5)}},
        "b": {"skipped": "not found"},
    }
    short = robustness_cache.cache_short_cells(traces)
    assert short == {
        "short": 2,
        "of_cells": 3,
        "a_member_alone_within_tolerance": ["a @ 0.05"],
        "no_member_within_tolerance": ["a @ 0.1"],
    }


def test_forecast_goals_say_where_the_learned_expert_alone_is_significantly_lower(
    robustness: ModuleType,
) -> None:
    """The significance goal's shortfall is the combination's only where an expert alone
    makes it: the goals count those series beside the combination's."""
    series = {
        "a": {"mase_ratio": 0.98, "significantly_lower": False,
              "attention_significantly_lower": True},
        "b": {"mase_ratio": 1.02, "significantly_lower": True,
              "attention_significantly_lower": False},
        "c": {"skipped": "not found"},
    }  # fmt: skip
    goals = robustness.forecast_goals(series, {})
    assert goals["forecast_significantly_below_on_2_series"] == {
        "holds": False,
        "series_significantly_lower": 1,
        "series_where_attention_alone_is": 1,
    }
    assert goals["forecast_mase_at_most_1.01x_best_baseline"] is False


def test_missing_shared_gives_skipped_entries(
    robustness: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert robustness.main(["--quick", "--shared", str(missing)]) == 0
    out = orjson.loads(capsys.readouterr().out)
    entries = [
        *out["cache"]["traces"].values(),
        *out["forecast"]["series"].values(),
        *out["hotset"]["windows"].values(),
    ]
    assert entries and all("not found" in entry["skipped"] for entry in entries)
    assert out["worst"] == {
        "cache_ratio_to_best_online": None,
        "forecast_mase_ratio": None,
        "hotset_recall_ratio": None,
    }
    assert out["goals"]["cache_never_below_lru"] is None


def test_unreadable_trace_is_skipped_with_the_reason(
    robustness: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "cache_traces" / "lirs" / "multi2.trace.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(gzip.compress(b"12\nnot-a-key\n"))
    assert robustness.main(["--quick", "--only", "cache", "--shared", str(tmp_path)]) == 0
    entry = orjson.loads(capsys.readouterr().out)["cache"]["traces"]["multi2.trace.gz"]
    assert "line 2" in entry["skipped"]


@pytest.mark.parametrize("argv", [["--bogus"], ["--only", "nope"], ["--horizon", "0"]])
def test_bad_flag_exits_2_with_one_line(
    robustness: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        robustness.main(argv)
    assert done.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


def test_hotset_family_trains_on_one_thread_as_the_command_does(
    robustness: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--only hotset` must print what the full run and `preheat bench hotset` print: the
    models' training depends on torch's thread count, which only the forecast family set."""
    import torch

    from models.evaluation.bench import hotset_bench

    threads: list[int] = []

    def recording_bench(*_args: object) -> dict[str, object]:
        threads.append(torch.get_num_threads())
        recall = {"recall_of_requests": 0.1}
        methods = {
            "preheat": recall,
            "planner": recall,
            "last_window": recall,
            "ewma_frequency": recall,
        }
        return {"windows": 3, "methods": methods, "preheat_chosen": "adahedge"}

    trace = tmp_path / robustness.HOTSET_TRACE
    trace.parent.mkdir(parents=True)
    trace.touch()
    monkeypatch.setattr(hotset_bench, "bench_hotset", recording_bench)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert robustness.main(["--quick", "--only", "hotset", "--shared", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(before)
    out = orjson.loads(capsys.readouterr().out)
    assert out["hotset"]["windows"]["mooncake_60s"]["ratio_to_better_frequency_baseline"] == 1.0
    assert threads == [1]

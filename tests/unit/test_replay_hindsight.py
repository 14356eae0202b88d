"""The warm-up plan of hindsight (`benchmarks/warmup_hindsight.py`): which blocks it keeps, and that
through the replay's worker it rebuilds what the next requests ask for, seen before or not."""

from __future__ import annotations

import numpy as np
import pytest

from cache_runtime.traces import AccessTrace
from models.evaluation.replay.engine import PreparedTrace, ReplayConfig, replay_arm
from models.evaluation.replay.hindsight import HindsightPlanner, in_time, warmup_hindsight
from models.evaluation.replay.latency import ReplayLatency

LATENCY = ReplayLatency(
    prefill_ms_per_token=0.1, load_ms_per_block={"memory": 1.0, "ssd": 2.0}, base_ms=10.0,
    source="test", servers=1,
)  # fmt: skip
NO_PARENTS = np.full(10, -1)


def _trace(requests: list[tuple[float, list[int]]]) -> AccessTrace:
    """(time s, block ids) requests; every block 512 tokens (51.2 ms of prefill)."""
    blocks = [b for _, ids in requests for b in ids]
    starts = np.cumsum([0] + [len(ids) for _, ids in requests[:-1]])
    times = [t for t, ids in requests for _ in ids]
    return AccessTrace(
        "test", np.array(blocks), starts.astype(np.int64), np.array(times, dtype=float),
        np.full(len(blocks), 512),
    )  # fmt: skip


def test_in_time_skips_what_it_cannot_deliver_and_goes_on() -> None:
    blocks, deadlines = np.array([0, 1, 2]), np.array([1.0, 1.05, 3.0])
    kept = in_time(blocks, deadlines, np.arange(3), np.ones(3), NO_PARENTS, start=0.0)
    assert kept.tolist() == [True, False, True]  # block 1 would arrive at 2 s, after 1.05 s
    late_start = in_time(blocks, deadlines, np.arange(3), np.ones(3), NO_PARENTS, start=2.5)
    assert late_start.tolist() == [False, False, False]


def test_in_time_keeps_a_child_only_behind_a_parent_its_request_would_hit() -> None:
    parents = np.array([-1, 0, -1, 2])  # 0 -> 1 in request 0; 2 in request 1, 3 in request 2
    blocks = np.array([0, 1, 2, 3])
    deadlines = np.array([0.5, 5.0, 0.5, 5.0])
    requests = np.array([0, 0, 1, 2])
    kept = in_time(blocks, deadlines, requests, np.ones(4), parents, start=0.0)
    # 0 and 2 are due before the worker's first item lands (1 s); 1 is behind the missed 0 in
    # the same request: useless; 3's parent is computed by an earlier request: 3 is kept
    assert kept.tolist() == [False, False, False, True]


def test_first_requests_in_order_of_first_use_within_the_span() -> None:
    trace = _trace([(0.0, [1, 2]), (10.0, [1, 3]), (11.0, [3, 4]), (30.0, [5])])
    prepared = PreparedTrace.build(trace)
    planner = HindsightPlanner(prepared)
    blocks, deadlines, requests = planner.first_requests(5.0, 20.0, None)
    ids = np.unique(trace.accesses)  # (U,) the block id behind each index
    assert ids[blocks].tolist() == [1, 3, 4]
    assert deadlines.tolist() == [10.0, 10.0, 11.0] and requests.tolist() == [1, 1, 2]
    seen = np.zeros(len(prepared.keys), dtype=bool)
    seen[blocks[0]] = True  # only block 1 was asked for before
    assert planner.first_requests(5.0, 20.0, seen)[0].tolist() == [blocks[0]]


def test_through_the_worker_it_rebuilds_the_next_requests_seen_before_or_not() -> None:
    early = [(float(t), [1, 2]) for t in range(0, 50, 5)]
    late = [(float(t), [1, 2, 7, 8]) for t in range(52, 100, 5)]
    prepared = PreparedTrace.build(_trace(early + late))
    config = ReplayConfig(memory=1.0, ssd=1.0, restart_every_s=50.0, warmup=True)
    full = replay_arm(prepared, config, LATENCY, planner=HindsightPlanner(prepared))
    seen = replay_arm(prepared, config, LATENCY, planner=HindsightPlanner(prepared, True))
    first_after = len(early)
    assert full.hit_blocks[first_after] == 4  # 7 and 8 too: hindsight knows them
    assert full.warm["items"] == 4 and full.warm["used"] == 4
    assert seen.hit_blocks[first_after] == 2  # 1 and 2 only: 7 was never asked for before
    assert seen.warm["items"] == 2


def test_warmup_hindsight_scores_every_warm_arm_against_the_reference() -> None:
    # a restart at 50 s with a burst right after it: the cold node queues
    requests = [(float(t), [1, 2, 3]) for t in range(0, 50, 5)]
    requests += [(52.0 + 0.01 * i, [1, 2, 3]) for i in range(5)]
    config = ReplayConfig(memory=1.0, ssd=1.0, restart_every_s=50.0, window_s=20, warmup=True)
    result = warmup_hindsight(_trace(requests), config, LATENCY)
    ttft = result["after_restart_ttft_ms"]
    assert set(ttft) == {"off", "on", "reference", "hindsight", "hindsight_seen"}
    assert ttft["off"]["p95"] > ttft["reference"]["p95"]
    # 2 s before the burst, the worker rebuilds all three blocks: as good as the reference,
    # but for loading them from the SSD instead of memory (2 ms instead of 1 ms a block)
    assert ttft["hindsight"]["mean"] == pytest.approx(ttft["reference"]["mean"], abs=5.0)
    assert result["recovered"]["hindsight"]["p95"] > 0.9
    assert result["warmup"]["hindsight"] == {"items": 3, "precision": 1.0, "cost_s": 0.154}

"""The hindsight ceiling of trace signals (`benchmarks/cache_ceiling.py`): its pieces and bounds."""

from __future__ import annotations

import numpy as np
import pytest

from cache_runtime.policies import LRUPolicy
from cache_runtime.simulator import replay
from cache_runtime.traces import AccessTrace
from models.evaluation.bench.signal_ceiling import (
    COUNT_BUCKETS,
    NEVER,
    access_classes,
    age_edges,
    bench_ceiling,
    next_use_distances,
    replay_by_table,
    reuse_table,
)


def test_next_use_distances() -> None:
    distances = next_use_distances(np.array([1, 2, 1, 3, 2, 1]))
    assert distances.tolist() == [2, 3, 3, NEVER, NEVER, NEVER]


def test_classes_carry_turn_count_and_last_block() -> None:
    # request 0 opens a conversation; request 1 extends its complete blocks (1, 2): turn 1
    trace = AccessTrace("t", np.array([1, 2, 3, 1, 2, 4, 5]), np.array([0, 3]))
    with_turns = access_classes(trace, use_turns=True).tolist()
    counts = len(COUNT_BUCKETS)

    def cls(turn: int, count_bucket: int, last: int) -> int:
        return (turn * counts + count_bucket) * 2 + last

    assert with_turns == [
        cls(0, 0, 0), cls(0, 0, 0), cls(0, 0, 1),  # first turn, each block seen once
        cls(1, 1, 0), cls(1, 1, 0), cls(1, 0, 0), cls(1, 0, 1),  # follow-up: 1, 2 seen twice
    ]  # fmt: skip
    without = access_classes(trace, use_turns=False).tolist()
    assert without == [c % (counts * 2) for c in with_turns]


def test_reuse_table_is_the_conditional_reuse_probability() -> None:
    classes = np.array([0, 0, 0, 0])
    distances = np.array([1, 1, 3, NEVER])
    table = reuse_table(classes, distances, window=1, edges=[0, 1, 2])
    # age 0: 2 of 4 reused within 1; age 1: of the 2 left, none at distance 2; age 2: 1 of 2
    assert table[0].tolist() == pytest.approx([0.5, 0.0, 0.5])


def test_a_reused_class_is_kept_where_lru_loses_it() -> None:
    """A hot object every 4th access among one-off objects, 2 entries of cache: LRU always
    evicts the hot one; eviction by the table keeps it once its class shows it comes back."""
    accesses = []
    for round_ in range(50):
        accesses += [0, 1000 + 3 * round_, 1001 + 3 * round_, 1002 + 3 * round_]
    trace = AccessTrace("hot", np.array(accesses), np.arange(len(accesses)))
    classes = access_classes(trace, use_turns=False)
    edges = age_edges(len(accesses))
    table = reuse_table(classes, next_use_distances(trace.accesses), 4, edges)
    hits = replay_by_table(trace, classes, table, edges, capacity=2)
    lru = replay(LRUPolicy(), trace.accesses, trace.request_starts, 2, hints=False)
    assert lru.sum() == 0
    assert hits[0::4][2:].all() and hits.sum() == 48  # every hot access from the third on


def test_bench_reports_the_gap_each_closes_and_belady_bounds_all() -> None:
    rng = np.random.default_rng(3)
    requests, starts = [], []
    for _ in range(300):  # conversations over a shared prefix, some extended later
        starts.append(sum(len(r) for r in requests))
        base = [0, 1] if rng.random() < 0.5 else list(rng.integers(2, 400, 3))
        requests.append([*map(int, base), *map(int, rng.integers(400, 4000, 3))])
    trace = AccessTrace("synthetic", np.concatenate(requests), np.array(starts))
    result = bench_ceiling(trace, [0.05, 0.2])
    for row in result["sizes"].values():
        for name in ("preheat", "ceiling_turns", "ceiling_no_turns"):
            assert row[name] <= row["Belady"]
            closed = (row[name] - row["LRU"]) / (row["Belady"] - row["LRU"])
            assert row[f"{name}_gap_closed"] == pytest.approx(closed, abs=1e-3)


def test_bad_capacity_is_refused() -> None:
    trace = AccessTrace("t", np.array([1, 2]), np.array([0, 1]))
    with pytest.raises(ValueError, match="capacity must be positive"):
        replay_by_table(trace, np.zeros(2, dtype=np.int64), np.zeros((1, 1)), [0], 0)

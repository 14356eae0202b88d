"""The replay's node runs the memory-tier pool that `[policy]` / `PREHEAT_POLICY__*` name for a
serving node (`ReplayConfig.policy`), in every incarnation, and refuses a bad one in one line."""

from __future__ import annotations

import numpy as np
import pytest

from cache_runtime.pool import PoolPolicy
from cache_runtime.traces import AccessTrace
from models.evaluation.replay.engine import PreparedTrace, ReplayConfig, replay_arm
from models.evaluation.replay.latency import ReplayLatency
from models.evaluation.replay.node import Node, TraceClock

LATENCY = ReplayLatency(
    prefill_ms_per_token=0.1, load_ms_per_block={"memory": 1.0, "ssd": 2.0, "redis": 3.0},
    base_ms=10.0, source="test",
)  # fmt: skip


def _loop(blocks: int, rounds: int) -> AccessTrace:
    """One-block requests, a second apart, cycling over `blocks` blocks `rounds` times."""
    accesses = np.tile(np.arange(blocks), rounds)
    n = len(accesses)
    return AccessTrace(
        "loop", accesses, np.arange(n, dtype=np.int64), np.arange(n, dtype=float),
        np.full(n, 16),
    )  # fmt: skip


def test_a_replayed_node_runs_the_configured_pool_in_every_incarnation() -> None:
    config = ReplayConfig(memory=0.5, ssd=0.0, policy={"pool": ["lru", "mq"], "sample_rate": 0.25})
    node = Node(100, 0, TraceClock(), fast_redis_blocks=0, policy=config.policy_settings())
    try:
        first = node.tier("memory").policy
        assert isinstance(first, PoolPolicy)
        assert first.pool == ("lru", "mq") and first.sample_rate == 0.25
        node.restart()
        second = node.tier("memory").policy
        assert isinstance(second, PoolPolicy) and second is not first  # a restart starts afresh
        assert second.pool == ("lru", "mq")
    finally:
        node.close()
    default = Node(100, 0, TraceClock(), fast_redis_blocks=0)
    try:
        assert default.tier("memory").policy.pool == PoolPolicy().pool
    finally:
        default.close()


def test_the_pool_configured_is_the_one_a_replay_arm_serves_from() -> None:
    """A loop of twice the memory: LRU evicts each block just before its next use, LIRS keeps
    a share of the loop."""
    prepared = PreparedTrace.build(_loop(40, 12))

    def memory_hits(pool: list[str]) -> int:
        config = ReplayConfig(memory=0.5, ssd=0.0, policy={"pool": pool})
        return replay_arm(prepared, config, LATENCY).served["memory"]

    assert memory_hits(["lru"]) == 0
    assert memory_hits(["lirs"]) > 100


def test_a_bad_policy_is_refused_in_one_line() -> None:
    for policy, problem in (
        ({"pool": ["belady"]}, r"^policy: pool: .*unknown candidates \['belady'\]"),
        ({"sample_rate": 2}, r"^policy: sample_rate: .*less than or equal to 1"),
        ({"bogus": 1}, r"^policy: bogus: Extra inputs are not permitted"),
    ):
        with pytest.raises(ValueError, match=problem) as refused:
            ReplayConfig(memory=0.1, ssd=0.1, policy=policy)
        assert "\n" not in str(refused.value)

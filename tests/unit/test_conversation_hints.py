"""Application hints: conversations found in prompts, the CONVERSATION insert, "ended" cooling."""

from __future__ import annotations

import numpy as np
import pytest

from cache_runtime.policies import Hint
from cache_runtime.pool import PoolPolicy
from cache_runtime.prefix_policies import PrefixARC, PrefixSLRU
from cache_runtime.simulator import AppHints, replay, replay_with_app_hints
from cache_runtime.traces import AccessTrace
from models.evaluation.bench.cache_bench import bench_cache
from models.evaluation.bench.conversations import app_hints, find_conversations


def trace_of(requests: list[list[int]]) -> AccessTrace:
    starts = np.cumsum([0] + [len(r) for r in requests[:-1]]).astype(np.int64)
    return AccessTrace("t", np.array([b for r in requests for b in r], dtype=np.int64), starts)


def test_follow_ups_extend_an_earlier_prompts_complete_blocks() -> None:
    trace = trace_of(
        [
            [1, 2, 3, 90],  # conversation 0, turn 0 (90: its partial last block)
            [1, 2, 3, 4, 5, 91],  # starts with 1 2 3: turn 1 of conversation 0
            [1, 2, 7, 92],  # shares a prefix but extends no whole prompt: a new conversation
            [1, 2, 3, 4, 5, 6, 93],  # extends request 1's complete blocks: turn 2
        ]
    )
    found = find_conversations(trace)
    assert found.session.tolist() == [0, 0, 1, 0]
    assert found.turn.tolist() == [0, 1, 0, 2]
    assert found.count == 2 and found.follow_ups == 2

    hints = app_hints(trace, found)
    assert hints.conversation.tolist() == [False] * 4 + [True] * 6 + [False] * 4 + [True] * 7
    # "ended" cools the blocks only that conversation read: 1 and 2 were read by both
    assert hints.cool_after[13] == [7, 92]  # conversation 1 ended after its only request
    last_access = len(trace.accesses) - 1
    assert hints.cool_after[last_access] == [3, 90, 4, 5, 91, 6, 93]


@pytest.mark.parametrize("policy", [PrefixARC, PrefixSLRU])
def test_a_live_conversations_blocks_survive_a_scan(policy: type) -> None:
    """Inserted with CONVERSATION, a block sits on the reused side: one-off blocks go first."""
    members = policy()
    resident = {"c"}
    members.on_insert("c", 0.0, Hint.CONVERSATION)
    for i in range(10):
        members.on_insert(f"s{i}", 0.0, None)
        resident.add(f"s{i}")
    evicted = []
    for _ in range(5):
        gone = members.victim(lambda _: False)
        members.on_remove(gone)
        evicted.append(gone)
    assert "c" not in evicted


def conversation_workload(seed: int = 0) -> AccessTrace:
    """Eight chats at a time, four turns each, between bursts of one-off requests: a chat's
    next turn comes back after more blocks than the cache holds, unless the cache knows the
    chat is live."""
    rng = np.random.default_rng(seed)
    requests, history, turns, next_block = [], {}, {}, 10_000
    for _ in range(1500):
        if rng.random() < 0.5:
            requests.append(list(range(next_block, next_block + 6)))  # a one-off request
            next_block += 6
            continue
        chat = int(rng.integers(0, 8))
        if turns.get(chat, 0) == 4:  # the chat ended: a new one takes its place
            history[chat], turns[chat] = [], 0
        prompt = history.get(chat, [])[:-1] + list(range(next_block, next_block + 3))
        next_block += 3
        history[chat], turns[chat] = prompt, turns.get(chat, 0) + 1
        requests.append(prompt)
    return trace_of(requests)


def test_conversation_hints_buy_hits_on_a_conversation_workload() -> None:
    trace = conversation_workload()
    hints = app_hints(trace, find_conversations(trace))
    capacity = 80
    plain = replay(PoolPolicy(capacity=capacity), trace.accesses, trace.request_starts, capacity)
    hinted = replay_with_app_hints(
        PoolPolicy(capacity=capacity), trace.accesses, trace.request_starts, capacity, hints
    )
    assert hinted.sum() > plain.sum() * 1.3  # measured: 2306 vs 1631 hits


def test_app_hints_of_the_wrong_length_are_rejected() -> None:
    trace = trace_of([[1, 2, 3], [1, 2, 4]])
    bad = AppHints(np.zeros(5, dtype=bool), {})
    with pytest.raises(ValueError, match="shape"):
        replay_with_app_hints(PrefixARC(), trace.accesses, trace.request_starts, 2, bad)


@pytest.mark.slow
def test_bench_reports_app_hints_only_for_prompt_traces() -> None:
    prompts = bench_cache(conversation_workload(1), [0.1])
    assert prompts["conversations"]["follow_up_requests"] > 0
    row = prompts["sizes"]["0.1"]
    assert row["preheat_app_hints_prefix"] <= row["preheat_app_hints"] <= row["Belady"]
    assert "gap_closed_app_hints_vs_lru" in row
    ids = np.random.default_rng(3).zipf(1.3, 3000).astype(np.int64) % 500
    keys = bench_cache(AccessTrace("kv", ids, np.arange(3000, dtype=np.int64)), [0.1])
    assert "conversations" not in keys and "preheat_app_hints" not in keys["sizes"]["0.1"]

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
from models.evaluation.bench.conversations import (
    EndedCall,
    app_hints,
    ended_after,
    find_conversations,
)


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
    untimed = conversation_workload(1)
    timed = AccessTrace(  # one request a second
        "timed", untimed.accesses, untimed.request_starts,
        np.repeat(np.arange(len(untimed.request_starts), dtype=np.float64),
                  np.diff(np.append(untimed.request_starts, len(untimed.accesses)))),
    )  # fmt: skip
    prompts = bench_cache(timed, [0.1])
    assert prompts["conversations"]["follow_up_requests"] > 0
    row = prompts["sizes"]["0.1"]
    for hints in ("session_turn", "idle_end", "explicit_close", "hindsight_end"):
        assert row[f"preheat_{hints}_prefix"] <= row[f"preheat_{hints}"] <= row["Belady"]
        assert f"gap_closed_{hints}_vs_lru" in row
    untimed_row = bench_cache(untimed, [0.1])["sizes"]["0.1"]  # no times: no timed ends
    assert "preheat_hindsight_end" in untimed_row and "preheat_idle_end" not in untimed_row
    ids = np.random.default_rng(3).zipf(1.3, 3000).astype(np.int64) % 500
    keys = bench_cache(AccessTrace("kv", ids, np.arange(3000, dtype=np.int64)), [0.1])
    assert "conversations" not in keys and "preheat_hindsight_end" not in keys["sizes"]["0.1"]


def _timed(requests: list[list[int]], starts_s: list[float]) -> AccessTrace:
    trace = trace_of(requests)
    times = np.repeat(np.array(starts_s), [len(r) for r in requests])
    return AccessTrace("timed", trace.accesses, trace.request_starts, times)


# conversation 0: turns at 0, 10 and 500 s; conversation 1: one request at 20 s; a one-off at 600
TIMED = _timed(
    [[1, 2, 3, 90], [1, 2, 3, 4, 5, 91], [50, 51, 52, 92], [1, 2, 3, 4, 5, 6, 93], [70, 71, 94]],
    [0.0, 10.0, 20.0, 500.0, 600.0],
)


def test_an_end_in_hindsight_follows_each_conversations_last_request() -> None:
    found = find_conversations(TIMED)
    assert found.session.tolist() == [0, 0, 1, 0, 2]
    assert ended_after(TIMED, found, EndedCall.HINDSIGHT) == {2: [1], 3: [0], 4: [2]}


def test_an_explicit_close_comes_after_the_reading_time() -> None:
    found = find_conversations(TIMED)
    # conversation 1 (last request at 20 s) closes at 50 s: after request 2, before 500 s;
    # conversation 0 (last at 500 s) at 530 s, before the one-off at 600 s
    assert ended_after(TIMED, found, EndedCall.EXPLICIT_CLOSE, 30.0) == {2: [1], 3: [0], 4: [2]}
    # with a reading time past the next request, the close comes after that one
    assert ended_after(TIMED, found, EndedCall.EXPLICIT_CLOSE, 550.0)[3] == [1]


def test_an_idle_timeout_ends_a_conversation_that_then_resumes() -> None:
    found = find_conversations(TIMED)
    ended = ended_after(TIMED, found, EndedCall.IDLE_TIMEOUT, 300.0)
    # conversation 0 is idle from 10 s to 500 s: ended at 310 s (after request 2); its turn at
    # 500 s ends at 800 s, after the one-off at 600 s; conversation 1 at 320 s
    assert ended == {2: [0, 1], 4: [0, 2]}
    assert found.turn.tolist()[3] == 2  # the resumed turn is still a follow-up
    hints = app_hints(TIMED, found, ended)
    first_end = int(TIMED.request_starts[3]) - 1
    assert sorted(hints.cool_after[first_end]) == [1, 2, 3, 4, 5, 50, 51, 52, 90, 91, 92]
    # turn 2 read 1..5 again after the premature end: read by no other conversation, they are
    # its own again (it goes on as usual), so its next end cools them too, then the one-off's
    assert hints.cool_after[len(TIMED.accesses) - 1] == [1, 2, 3, 4, 5, 6, 93, 70, 71, 94]


def test_timed_ends_need_the_traces_times_and_a_wait_not_below_zero() -> None:
    untimed = trace_of([[1, 2, 3, 90], [1, 2, 3, 4, 5, 91]])
    found = find_conversations(untimed)
    with pytest.raises(ValueError, match="times"):
        ended_after(untimed, found, EndedCall.IDLE_TIMEOUT, 300.0)
    with pytest.raises(ValueError, match="negative"):
        ended_after(TIMED, find_conversations(TIMED), EndedCall.EXPLICIT_CLOSE, -1.0)

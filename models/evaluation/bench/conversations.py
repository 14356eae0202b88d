"""Conversations in a multi-block request trace: what a serving application's session ids, turn
numbers and "conversation ended" calls would tell the cache, recovered from the prompts.

A request continues a conversation when its blocks start with every complete block (two at
least) of an earlier request (all of that request's blocks but its last, partial one): its
prompt is the earlier prompt, the answer and a new question. This uses only requests before
it, as a session id does.

When "conversation ended" comes is what separates a hint an application has from hindsight
(`EndedCall`): right after the conversation's last request is hindsight (nobody knows then that
it was the last: an upper bound); an explicit close comes after that last answer plus the time
the user reads it; an idle timeout fires after any turn not followed within the timeout, so it
may end a conversation that then resumes (which goes on as usual: its next turn is still a
follow-up, and the pages it reads again are its own again). Ends fire between requests: after
the last request that started before them.

What "ended" cools is chosen by the cache's own `SessionPages`, as a gateway would use it: the
blocks no other conversation has read so far.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from cache_runtime.sessions import SessionPages
from cache_runtime.simulator import AppHints
from cache_runtime.traces import AccessTrace


@dataclass(frozen=True)
class Conversations:
    session: np.ndarray  # (R,) int64 conversation id of each request, in order of first turn
    turn: np.ndarray  # (R,) int64 0 for a conversation's first request

    @property
    def count(self) -> int:
        return int(self.session.max()) + 1 if len(self.session) else 0

    @property
    def follow_ups(self) -> int:
        return int((self.turn > 0).sum())


def find_conversations(trace: AccessTrace) -> Conversations:
    """Group requests into conversations (see the module docstring)."""
    starts = trace.request_starts.tolist()
    ends = [*starts[1:], len(trace.accesses)]
    blocks_of = trace.accesses.tolist()
    known: dict[tuple[int, ...], tuple[int, int]] = {}  # complete blocks -> (session, turn)
    session: list[int] = []
    turn: list[int] = []
    opened = 0
    for start, end in zip(starts, ends, strict=True):
        blocks = tuple(blocks_of[start:end])
        found = None
        # the longest earlier prompt it extends, of two blocks at least: one block in common
        # is a shared system prompt's first block as often as it is a conversation
        for length in range(len(blocks) - 1, 1, -1):
            found = known.get(blocks[:length])
            if found is not None:
                break
        if found is None:
            session.append(opened)
            opened += 1
            turn.append(0)
        else:
            session.append(found[0])
            turn.append(found[1] + 1)
        known[blocks[:-1]] = (session[-1], turn[-1])
    return Conversations(np.array(session, dtype=np.int64), np.array(turn, dtype=np.int64))


class EndedCall(Enum):
    """When the "conversation ended" call comes (module docstring)."""

    HINDSIGHT = "hindsight"  # right after the last request: an upper bound
    EXPLICIT_CLOSE = "explicit_close"  # after the last request plus the reading time
    IDLE_TIMEOUT = "idle_timeout"  # after any request not followed within the timeout


def ended_after(
    trace: AccessTrace, conversations: Conversations, call: EndedCall, wait_s: float = 0.0
) -> dict[int, list[int]]:
    """request index -> the conversations whose "ended" call comes right after it. `wait_s`:
    the reading time (explicit close) or the timeout (idle); the trace needs times for both.

    Raises:
        ValueError: a timed call on a trace without times, or a negative wait.
    """
    sessions = conversations.session.tolist()
    last = {sid: request for request, sid in enumerate(sessions)}
    if call is EndedCall.HINDSIGHT:
        return _grouped((request, sid) for sid, request in last.items())
    if trace.times is None:
        raise ValueError(f"a {call.value} end needs the trace's times, which {trace.name} lacks")
    if wait_s < 0:
        raise ValueError("the wait before an end must not be negative")
    started = trace.times[trace.request_starts]  # (R,) each request's start, seconds
    if call is EndedCall.EXPLICIT_CLOSE:
        due = [(started[request] + wait_s, sid, request) for sid, request in last.items()]
    else:
        following: dict[int, float] = {}  # sid -> start of its next request, walking back
        due = []
        for request in range(len(sessions) - 1, -1, -1):
            sid = sessions[request]
            deadline = started[request] + wait_s
            if following.get(sid, np.inf) >= deadline:  # not followed within the timeout
                due.append((deadline, sid, request))
            following[sid] = started[request]
    # the last request that started before the call (never before the turn it follows): the
    # call comes right after that one
    placed = np.searchsorted(started, [d for d, _, _ in due], side="left") - 1
    return _grouped(
        (max(int(at), turn), sid) for at, (_, sid, turn) in zip(placed, due, strict=True)
    )


def _grouped(pairs: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for request, sid in sorted(pairs):
        grouped.setdefault(request, []).append(sid)
    return grouped


def app_hints(
    trace: AccessTrace,
    conversations: Conversations,
    ended: dict[int, list[int]] | None = None,
) -> AppHints:
    """Per access: inside a follow-up turn (a live conversation: `Hint.CONVERSATION`); after
    the requests `ended` names (`ended_after`; None: in hindsight), the blocks `SessionPages`
    says only the ended conversations have read, declared cold."""
    starts = trace.request_starts.tolist()
    ends = [*starts[1:], len(trace.accesses)]
    lengths = np.diff(np.append(trace.request_starts, len(trace.accesses)))
    conversation = np.repeat(conversations.turn > 0, lengths)
    sessions = conversations.session.tolist()
    if ended is None:
        ended = ended_after(trace, conversations, EndedCall.HINDSIGHT)
    tracker: SessionPages[int] = SessionPages()
    blocks = trace.accesses.tolist()
    cool_after: dict[int, list[int]] = {}
    for request, sid in enumerate(sessions):
        tracker.read(sid, blocks[starts[request] : ends[request]])
        for gone in ended.get(request, ()):
            cool_after.setdefault(ends[request] - 1, []).extend(tracker.end(gone))
    return AppHints(conversation, cool_after)

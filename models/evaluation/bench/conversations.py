"""Conversations in a multi-block request trace: what a serving application's session ids, turn
numbers and "conversation ended" calls would tell the cache, recovered from the prompts.

A request continues a conversation when its blocks start with every complete block (two at
least) of an earlier request (all of that request's blocks but its last, partial one): its
prompt is the earlier prompt, the answer and a new question. This uses only requests before
it, as a session id does. The "conversation ended" call is the application's (the user closed
the chat); in a recorded trace it is placed right after the conversation's last request — in
hindsight, which is what an explicit close at that moment gives the application.

What "ended" cools is chosen by the cache's own `SessionPages`, as a gateway would use it: the
blocks no other conversation has read so far.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def app_hints(trace: AccessTrace, conversations: Conversations) -> AppHints:
    """Per access: inside a follow-up turn (a live conversation: `Hint.CONVERSATION`); after a
    conversation's last request: the blocks `SessionPages` says only it has read, declared cold."""
    starts = trace.request_starts.tolist()
    ends = [*starts[1:], len(trace.accesses)]
    lengths = np.diff(np.append(trace.request_starts, len(trace.accesses)))
    conversation = np.repeat(conversations.turn > 0, lengths)
    sessions = conversations.session.tolist()
    last_request = {sid: request for request, sid in enumerate(sessions)}
    tracker: SessionPages[int] = SessionPages()
    blocks = trace.accesses.tolist()
    cool_after: dict[int, list[int]] = {}
    for request, sid in enumerate(sessions):
        tracker.read(sid, blocks[starts[request] : ends[request]])
        if last_request[sid] == request:
            cool_after[ends[request] - 1] = tracker.end(sid)
    return AppHints(conversation, cool_after)

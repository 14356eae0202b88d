"""SessionPages: "conversation ended" cools only the entries no other conversation read."""

from __future__ import annotations

import threading

import pytest

from cache_runtime.sessions import SessionPages


def test_end_returns_only_the_pages_no_other_session_read() -> None:
    pages: SessionPages[str] = SessionPages()
    pages.read("a", ["system", "a-doc", "a-question"])
    pages.read("b", ["system", "b-question"])  # the system prompt is shared from here on
    pages.read("a", ["a-doc", "a-answer"])  # rereading its own pages keeps them private
    assert pages.end("a") == ["a-doc", "a-question", "a-answer"]
    assert pages.end("b") == ["b-question"]
    assert len(pages) == 0


def test_end_forgets_the_session_and_an_unknown_session_has_nothing() -> None:
    pages: SessionPages[str] = SessionPages()
    pages.read("a", ["p"])
    assert pages.end("a") == ["p"]
    assert pages.end("a") == []
    assert pages.end("never-seen") == []


def test_a_page_read_again_after_its_session_ended_is_shared() -> None:
    """A document one chat read and a later chat reads again is worth keeping: the later
    chat's end must not cool it."""
    pages: SessionPages[str] = SessionPages()
    pages.read("a", ["doc"])
    assert pages.end("a") == ["doc"]
    pages.read("b", ["doc", "b-own"])
    assert pages.end("b") == ["b-own"]


def test_sessions_are_any_hashable_id() -> None:
    pages: SessionPages[int] = SessionPages()
    pages.read(("acme", "s1"), [1, 2])
    pages.read(("globex", "s1"), [2, 3])  # same id, another tenant: another session
    assert pages.end(("acme", "s1")) == [1]


def test_when_full_the_oldest_records_go_and_are_never_cooled() -> None:
    pages: SessionPages[str] = SessionPages(max_pages=3, max_sessions=2)
    pages.read("a", ["a1", "a2"])
    pages.read("b", ["b1", "b2"])  # four records: a1 is forgotten
    assert pages.end("a") == ["a2"]
    pages.read("c", ["c1"])
    pages.read("d", ["d1"])  # three live sessions: b, the least recently active, is dropped
    assert pages.end("b") == []
    assert pages.end("d") == ["d1"]


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SessionPages(max_pages=0)
    with pytest.raises(ValueError, match="positive"):
        SessionPages(max_sessions=-1)


def test_concurrent_readers_lose_no_record() -> None:
    pages: SessionPages[str] = SessionPages()

    def chat(session: int) -> None:
        for turn in range(200):
            pages.read(session, ["shared", f"{session}-{turn}"])

    threads = [threading.Thread(target=chat, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in range(4):
        assert pages.end(session) == [f"{session}-{turn}" for turn in range(200)]

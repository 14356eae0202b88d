"""SessionPages: "conversation ended" cools only the entries no other conversation read."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from helpers import FakeClock

from cache_runtime.sessions import SessionPages, TenantSessionPages


def test_end_returns_only_the_pages_no_other_session_read() -> None:
    pages: SessionPages[str] = SessionPages()
    pages.read("a", ["system", "a-doc", "a-question"])
    pages.read("b", ["system", "b-question"])  # the system prompt is shared from here on
    pages.read("a", ["a-doc", "a-answer"])  # rereading its own pages keeps them private
    assert pages.end("a") == ["a-doc", "a-question", "a-answer"]
    assert pages.end("b") == ["b-question"]
    assert pages.stats()["sessions"] == 0


def test_end_forgets_the_session_and_an_unknown_session_has_nothing() -> None:
    pages: SessionPages[str] = SessionPages()
    assert not pages.live("a")
    pages.read("a", ["p"])
    assert pages.live("a")  # its next request is a follow-up turn
    assert pages.end("a") == ["p"]
    assert not pages.live("a")
    assert pages.end("a") == []
    assert pages.end("never-seen") == []


def test_pages_read_without_a_session_are_shared() -> None:
    """A warmed system prompt, or one read by API calls without a conversation id, is never
    cooled by the end of a session that reads it (before or after them)."""
    pages: SessionPages[str] = SessionPages()
    pages.read_anonymously(["warmed-system"])
    pages.read("a", ["warmed-system", "a-own", "system-2"])
    pages.read_anonymously(["system-2"])
    assert pages.end("a") == ["a-own"]


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


def test_when_full_the_least_recently_read_records_go_and_are_never_cooled() -> None:
    pages: SessionPages[str] = SessionPages(max_pages=3, max_sessions=2)
    pages.read("a", ["a1", "a2"])
    pages.read("b", ["b1"])
    pages.read("a", ["a1"])  # read again: a2 is now the least recently read
    pages.read("b", ["b2"])  # four records: a2 is forgotten
    assert pages.end("a") == ["a1"]
    pages.read("c", ["c1"])
    pages.read("d", ["d1"])  # three live sessions: b, the least recently active, is dropped
    assert pages.end("b") == []
    assert pages.end("d") == ["d1"]


def test_a_shared_prompt_read_all_the_time_is_never_forgotten_and_cooled() -> None:
    """Records go least recently read first: the system prompt every chat reads stays shared,
    where dropping the oldest record first would have let the next reader own and cool it."""
    pages: SessionPages[str] = SessionPages(max_pages=3)
    pages.read("a", ["system"])
    pages.read("b", ["system"])  # shared
    pages.read("c", ["c1"])
    pages.read("d", ["system"])
    pages.read("e", ["e1"])
    pages.read("f", ["f1"])  # one record too many: c1 goes, not the system prompt
    pages.read("g", ["system", "g1"])
    assert pages.end("g") == ["g1"]
    assert pages.end("c") == []


def test_memory_stays_within_the_page_budget_however_long_a_session_runs() -> None:
    pages: SessionPages[str] = SessionPages(max_pages=100, max_sessions=10)
    for turn in range(2000):
        pages.read("long-chat", [f"page-{turn}"])
        pages.read(f"one-off-{turn}", [f"other-{turn}"])
        pages.read_anonymously([f"anonymous-{turn}"])
    stats = pages.stats()
    assert stats["pages"] == 100 and stats["listed"] <= 100 and stats["sessions"] == 10
    assert pages.end("long-chat") == [f"page-{turn}" for turn in range(1967, 2000)]


def test_a_page_reread_after_its_record_was_dropped_is_listed_once() -> None:
    pages: SessionPages[str] = SessionPages(max_pages=2)
    pages.read("a", ["doc"])
    pages.read("b", ["b1", "b2"])  # doc's record goes
    pages.read("a", ["doc"])  # a reads it again: a fresh record, still a's own
    assert pages.end("a") == ["doc"]


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


# -- TenantSessionPages: one budget, shared fairly among tenants ---------------------------------


def test_one_tenants_flood_does_not_push_out_another_tenants_records() -> None:
    """The bounds are shared, but the tenant holding the most gives up its records: acme,
    within its fair share, keeps every record, so its end still cools its pages."""
    tracker = TenantSessionPages(max_pages=100, max_sessions=50)
    tracker.read("acme", "chat", [f"acme-{i}" for i in range(30)])
    for turn in range(500):
        tracker.read("globex", f"bot-{turn}", [f"globex-{turn}-{i}" for i in range(4)])
    assert tracker.live("acme", "chat")
    assert tracker.end("acme", "chat") == [f"acme-{i}" for i in range(30)]
    stats = tracker.stats()
    assert stats["pages"] <= 100 and stats["sessions"] <= 50
    assert stats["tenants"] == 2


def test_the_budget_is_levelled_across_tenants() -> None:
    """Over budget, the largest tenants come down to one level; the smallest keeps all."""
    tracker = TenantSessionPages(max_pages=100, max_sessions=1000)
    tracker.read("small", "s", [f"s{i}" for i in range(10)])
    tracker.read("mid", "m", [f"m{i}" for i in range(40)])
    tracker.read("big", "b", [f"b{i}" for i in range(60)])  # 110 records: 10 (+1%) too many
    pages = {t: len(tracker.end(t, s)) for t, s in (("small", "s"), ("mid", "m"), ("big", "b"))}
    assert pages["small"] == 10 and pages["mid"] == 40
    assert 40 <= pages["big"] < 60  # only the largest gave records up
    assert sum(pages.values()) <= 100


def test_a_tenants_live_session_survives_another_tenants_many_sessions() -> None:
    tracker = TenantSessionPages(max_pages=10_000, max_sessions=20)
    tracker.read("acme", "chat", ["acme-doc"])
    for n in range(200):
        tracker.read("globex", f"s{n}", [f"g{n}"])
    assert tracker.live("acme", "chat")
    assert tracker.stats()["sessions"] <= 20
    assert tracker.end("acme", "chat") == ["acme-doc"]


def test_sessions_and_sharing_are_scoped_by_tenant() -> None:
    tracker = TenantSessionPages()
    tracker.read("acme", "s1", ["system", "a-own"])
    tracker.read("acme", "s2", ["system"])  # shared within acme
    tracker.read("globex", "s1", ["g-own"])  # the same session id in another tenant
    tracker.read_anonymously("globex", ["g-system"])
    tracker.read("globex", "s1", ["g-system"])
    assert tracker.end("acme", "s1") == ["a-own"]
    assert tracker.end("globex", "s1") == ["g-own"]
    assert tracker.end("initech", "s1") == []  # an unknown tenant: nothing, and no tracker
    assert not tracker.live("initech", "s1")
    assert tracker.stats()["tenants"] == 2  # acme's s2 and globex's shared record remain


def test_a_tenant_just_within_its_fair_share_keeps_every_record() -> None:
    """The trim frees a little more than the excess (so it does not run on every read), but
    never out of a tenant within its share of the budget."""
    tracker = TenantSessionPages(max_pages=10_000, max_sessions=1000)
    tracker.read("acme", "chat", [f"a{i}" for i in range(4990)])  # fair share: 5,000
    tracker.read("globex", "bot", [f"g{i}" for i in range(5011)])  # 1 record over the budget
    assert len(tracker.end("acme", "chat")) == 4990
    assert tracker.stats()["pages"] <= 10_000


def test_a_read_that_fails_part_way_leaves_the_totals_true() -> None:
    tracker = TenantSessionPages(max_pages=100, max_sessions=10)
    with pytest.raises(TypeError):
        tracker.read("acme", "chat", ["a1", "a2", ["not", "hashable"], "a3"])  # type: ignore[list-item]
    stats = tracker.stats()
    assert (tracker._pages, tracker._sessions) == (stats["pages"], stats["sessions"]) == (2, 1)
    for n in range(300):  # the budget still holds
        tracker.read("globex", f"s{n}", [f"g{n}"])
    stats = tracker.stats()
    assert stats["pages"] <= 100 and stats["sessions"] <= 10


def test_tenant_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TenantSessionPages(max_pages=0)


def test_concurrent_tenants_keep_the_totals_exact() -> None:
    tracker = TenantSessionPages(max_pages=500, max_sessions=40)

    def chat(tenant: str) -> None:
        for turn in range(300):
            tracker.read(tenant, f"{tenant}-{turn % 30}", [f"{tenant}-{turn}", "shared"])

    threads = [threading.Thread(target=chat, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = tracker.stats()
    assert 0 < stats["pages"] <= 500 and 0 < stats["sessions"] <= 40
    assert (tracker._pages, tracker._sessions) == (stats["pages"], stats["sessions"])


# -- the idle end ---------------------------------------------------------------------------------


def test_an_idle_session_is_ended_for_its_own_pages_and_goes_on_as_a_follow_up() -> None:
    clock = FakeClock(0.0)
    pages: SessionPages[str] = SessionPages(clock=clock)
    pages.read("a", ["system", "a-1"])
    clock.now = 100.0
    pages.read("b", ["system", "b-1"])
    clock.now = 299.0
    assert pages.idle(300.0) == []  # a read 299 s ago: not yet
    clock.now = 300.0
    assert pages.idle(300.0) == ["a-1"]  # the shared system prompt stays warm
    assert pages.idle(300.0) == []  # ended once, not at every look
    assert pages.live("a")  # if it resumes, its next turn is a follow-up
    pages.read("a", ["system", "a-1", "a-2"])  # it resumes: its history is its own again
    clock.now = 400.0
    assert pages.idle(300.0) == ["b-1"]
    clock.now = 600.0
    assert pages.idle(300.0) == ["a-1", "a-2"]
    assert pages.end("a") == [] and not pages.live("a")  # cooled already


def test_a_session_pushed_out_by_the_bound_is_not_idle_ended() -> None:
    clock = FakeClock(0.0)
    pages: SessionPages[str] = SessionPages(max_sessions=2, clock=clock)
    for name in ("s1", "s2", "s3"):
        pages.read(name, [f"{name}-page"])
    clock.now = 10.0
    assert pages.idle(5.0) == ["s2-page", "s3-page"]  # s1 was forgotten: its pages stay warm
    pages.read("s2", ["s2-page"])
    pages.read("s3", ["s3-page"])
    pages.drop_oldest(sessions=1)  # a shared budget takes s2, the least recently active
    clock.now = 20.0
    assert pages.idle(5.0) == ["s3-page"] and pages.stats()["sessions"] == 1


def test_the_idle_end_covers_every_tenant_only_when_it_has_a_timeout() -> None:
    clock = FakeClock(0.0)
    never = TenantSessionPages(clock=clock)
    never.read("acme", "chat", ["acme-page"])
    clock.now = 1e9
    assert never.idle_ended() == []  # no timeout: ended only when told
    tracker = TenantSessionPages(idle_end_s=60.0, clock=clock)
    tracker.read("acme", "chat", ["acme-page"])
    tracker.read("globex", "chat", ["globex-page"])  # the same id, another tenant
    clock.now += 30.0
    tracker.read("globex", "chat", ["globex-page-2"])
    clock.now += 30.0
    assert tracker.idle_ended() == ["acme-page"]
    clock.now += 30.0
    assert tracker.idle_ended() == ["globex-page", "globex-page-2"]
    assert tracker.live("acme", "chat") and tracker.live("globex", "chat")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="idle_end_s"):
            TenantSessionPages(idle_end_s=bad)


def test_the_gateways_cache_ends_idle_conversations_as_its_config_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`preheat gateway` builds its cache with `assembly.open_cache`: 300 s by default,
    `PREHEAT_GATEWAY_SESSION_IDLE_END_S` otherwise, 0 for never."""
    from cache_runtime.serving.config import GatewayConfig
    from models.serving.assembly import open_cache

    def idle_end_s() -> float | None:
        cache = open_cache(GatewayConfig(data_dir=tmp_path, ssd_bytes=0, memory_bytes=1 << 20))
        try:
            return cache.sessions.idle_end_s
        finally:
            cache.close()

    assert idle_end_s() == 300.0
    monkeypatch.setenv("PREHEAT_GATEWAY_SESSION_IDLE_END_S", "45")
    assert idle_end_s() == 45.0
    monkeypatch.setenv("PREHEAT_GATEWAY_SESSION_IDLE_END_S", "0")
    assert idle_end_s() is None

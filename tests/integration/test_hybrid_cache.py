"""HybridCache over real tiers: order, promotion, demotion, TTL modes, faults, health.

Invalidation and its races are in test_hybrid_cache_invalidation.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import FakeClock, wait_until
from hybrid_cache_support import e, k
from prometheus_client import generate_latest

from cache_runtime.generations import GenerationsUnavailable
from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import PrefixKey
from cache_runtime.services import RedisServer
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

pytestmark = pytest.mark.integration


def test_hit_below_is_promoted_into_every_tier_above(three_tiers: tuple) -> None:
    memory, ssd, _ = three_tiers
    cache = HybridCache(three_tiers, write_through=["redis"])
    assert cache.put(k("q"), b"answer")
    assert not memory.contains(k("q").to_string()) and not ssd.contains(k("q").to_string())
    assert cache.get(k("q")) == b"answer"
    assert memory.contains(k("q").to_string()) and ssd.contains(k("q").to_string())
    m = cache.metrics
    assert m.value("preheat_cache_promotions_total", tier="memory") == 1
    assert m.value("preheat_cache_lookups_total", tier="redis", kind="exact", result="hit") == 1
    assert cache.get(k("q")) == b"answer"
    assert m.value("preheat_cache_lookups_total", tier="memory", kind="exact", result="hit") == 1


def test_memory_evictions_are_demoted_not_lost(three_tiers: tuple) -> None:
    memory, ssd, _ = three_tiers
    cache = HybridCache(three_tiers, write_through=["memory"])
    for i in range(10):
        assert cache.put(e(f"q{i}"), bytes([i]) * 300)  # memory holds 3 of them
    assert memory.stats().evictions == 7
    assert cache.metrics.value("preheat_cache_demotions_total", tier="ssd") == 7
    assert all(cache.get(e(f"q{i}")) == bytes([i]) * 300 for i in range(10))
    assert ssd.check() == [] and memory.check() == []


def test_tenants_never_see_each_others_entries(three_tiers: tuple) -> None:
    cache = HybridCache(three_tiers)
    cache.put(k("What is my balance?", "acme"), b"acme: 1,000,000")
    assert cache.get_exact("globex", "tiny-gpt2", "What is my balance?") is None
    assert cache.get_exact("acme", "tiny-gpt2", " What is  my balance?") == b"acme: 1,000,000"


def test_ttl_fixed_versus_renew_on_hit() -> None:
    clock = FakeClock()
    cache = HybridCache([MemoryTier(1000, clock=clock)])
    cache.put(k("fixed"), b"f", ttl_s=10, ttl_mode="fixed")
    cache.put(k("renew"), b"r", ttl_s=10, ttl_mode="renew")
    for _ in range(3):
        clock.now += 8
        cache.get(k("fixed"))
        assert cache.get(k("renew")) == b"r"  # each hit pushes its expiry 10 s out
    assert cache.get(k("fixed")) is None
    clock.now += 11
    assert cache.get(k("renew")) is None


def test_pinned_entries_survive_pressure() -> None:
    cache = HybridCache([MemoryTier(100)])
    cache.put(e("system prompt"), b"s" * 50, pinned=True)
    for i in range(20):
        cache.put(e(f"q{i}"), b"x" * 30)
    assert cache.get(e("system prompt")) == b"s" * 50


def test_longest_prefix_stops_at_first_missing_page() -> None:
    cache = HybridCache([MemoryTier(10_000)])
    pages = PrefixKey.chain("acme", "tiny-gpt2", [[i] * 16 for i in range(5)])
    for parent, page in zip([None, *pages[:2]], pages[:3], strict=True):
        assert cache.put(page, b"kv", parent=parent)
    assert cache.longest_prefix(pages) == 3
    other_tenant = PrefixKey.chain("globex", "tiny-gpt2", [[i] * 16 for i in range(5)])
    assert cache.longest_prefix(other_tenant) == 0


class BrokenTier(MemoryTier):
    def get(self, key: str) -> bytes | None:
        raise OSError("disk on fire")

    def put(self, key: str, value: bytes, **kwargs: object) -> bool:
        raise OSError("disk on fire")


def test_a_raising_tier_degrades_the_cache_not_the_request(tmp_path: Path) -> None:
    cache = HybridCache([BrokenTier(1000, name="broken"), MemoryTier(1000, name="memory")])
    assert cache.put(k("q"), b"v")
    assert cache.get(k("q")) == b"v"
    assert cache.metrics.value("preheat_cache_errors_total", tier="broken", op="get") == 1
    assert cache.metrics.value("preheat_cache_errors_total", tier="broken", op="put") >= 1


def test_a_tier_that_failed_is_reported_degraded_for_ten_seconds_on_the_given_clock() -> None:
    clock = FakeClock()
    cache = HybridCache(
        [BrokenTier(1000, name="broken"), MemoryTier(1000, name="memory")], clock=clock
    )
    assert cache.get(e("q")) is None  # the broken tier raised: a miss, remembered at `now`
    clock.now += 3
    assert cache.health() == {"broken": "get (OSError) failed 3.0s ago; served by the other tiers"}
    assert cache.metrics.value("preheat_cache_degraded", component="broken") == 1
    clock.now += 7.5  # 10.5 s after the failure: past `RECENT_ERROR_S`
    assert cache.health() == {}
    assert cache.metrics.value("preheat_cache_degraded", component="broken") == 0


def test_redis_killed_then_restarted_empty(tmp_path: Path) -> None:
    """Without Redis, answers cannot be validated: they miss, and health says why; embeddings
    and KV pages are immutable and keep hitting from memory. A Redis restarted empty starts
    every counter at a new random value: the answers held in memory from before never match."""
    server = RedisServer().start()
    redis_tier = RedisTier(redis_client(server.url, socket_timeout_s=0.2))
    cache = HybridCache([MemoryTier(10_000), redis_tier])
    page = PrefixKey.chain("acme", "tiny-gpt2", [list(range(16))])[0]
    assert cache.put(k("before"), b"1") and cache.put(e("before"), b"v") and cache.put(page, b"kv")
    assert cache.health() == {}
    server.stop()  # killed mid-test
    assert cache.get(k("before")) is None  # cannot be validated: a miss, no exception
    assert cache.get(e("before")) == b"v" and cache.get(page) == b"kv"  # local hits
    assert not cache.put(k("during"), b"2")  # not stored unvalidated
    assert cache.put(e("during"), b"2")  # memory still takes the immutable kinds
    assert "generations" in cache.health()
    with pytest.raises(GenerationsUnavailable):
        cache.invalidate(k("before"))  # an invalidation that did not happen says so
    unvalidated = cache.metrics.value(
        "preheat_cache_lookups_total", tier="generations", kind="exact", result="unvalidated"
    )
    assert unvalidated >= 1
    assert cache.metrics.value("preheat_cache_degraded", component="generations") == 1
    restarted = RedisServer(port=server.port).start()
    try:
        wait_until(lambda: cache.health() == {})
        assert cache.get(k("before")) is None  # its stamp is of the lost counters
        assert cache.put(k("after"), b"3") and cache.get(k("after")) == b"3"
        assert redis_tier.get(k("after").to_string()).endswith(b"\n3")  # the tier reconnected
    finally:
        restarted.stop()
        cache.close()


def test_metrics_registry_belongs_to_the_instance() -> None:
    a, b = HybridCache([MemoryTier(100)]), HybridCache([MemoryTier(100)])
    a.get(k("x"))
    assert (
        a.metrics.value("preheat_cache_lookups_total", tier="memory", kind="exact", result="miss")
        == 1
    )
    assert (
        b.metrics.value("preheat_cache_lookups_total", tier="memory", kind="exact", result="miss")
        == 0
    )
    a.refresh_gauges()
    assert b"preheat_cache_op_seconds_bucket" in generate_latest(a.metrics.registry)


def test_configuration_errors() -> None:
    with pytest.raises(ValueError, match="at least one tier"):
        HybridCache([])
    with pytest.raises(ValueError, match="unique"):
        HybridCache([MemoryTier(10), MemoryTier(10)])
    with pytest.raises(ValueError, match="unknown tiers"):
        HybridCache([MemoryTier(10)], write_through=["ssd"])


def test_conversation_end_cools_its_pages_first() -> None:
    cache = HybridCache([MemoryTier(40)])
    for name in ("shared-system-prompt", "other-chat", "ended-chat", "recent"):
        cache.put(e(name), b"x" * 10)
        cache.get(e(name))
    assert cache.cool([e("ended-chat")]) == 1
    cache.put(e("new"), b"x" * 10)
    assert cache.get(e("ended-chat")) is None
    assert cache.get(e("shared-system-prompt")) == b"x" * 10


def test_promotion_keeps_the_expiry() -> None:
    clock = FakeClock()
    top, bottom = (
        MemoryTier(1000, clock=clock, name="top"),
        MemoryTier(1000, clock=clock, name="bottom"),
    )
    cache = HybridCache([top, bottom], write_through=["bottom"])
    cache.put(k("q"), b"v", ttl_s=60)
    clock.now += 10
    assert cache.get(k("q")) == b"v"  # promoted into top with 50 s left, not forever
    assert top.ttl_left(k("q").to_string()) == pytest.approx(50)
    clock.now += 51
    assert cache.get(k("q")) is None


def test_promoted_pages_stay_linked_to_their_prefix(tmp_path: Path) -> None:
    """Pages read from the SSD in chain order are promoted with their parent: the memory tier
    keeps the chain prefix-closed (a child goes before its parent), and a page whose parent is
    not in memory is not promoted alone (it would be unusable there)."""
    from cache_runtime.kv_pages import page_keys

    memory, ssd = MemoryTier(350), SSDTier(tmp_path / "ssd", 100_000)
    cache = HybridCache([memory, ssd], write_through=["ssd"])
    chain = [key.to_string() for key in page_keys("acme", "tiny-gpt2", list(range(48)))]
    parent = None
    for key in chain:
        assert cache.put(key, b"p" * 100, parent=parent)
        parent = key
    parent = None
    for key in chain:
        assert cache.get(key, parent=parent) == b"p" * 100
        parent = key
    assert all(memory.contains(key) for key in chain) and memory.check() == []
    assert memory._entries[chain[2]].parent == chain[1]  # the link came along
    assert memory.put("other", b"x" * 100)  # memory is full: a page must go, the chain's last
    assert memory.contains(chain[0]) and memory.contains(chain[1])
    assert not memory.contains(chain[2]) and memory.check() == []
    memory.delete(chain[0])  # takes its descendants along
    assert cache.get(chain[1], parent=chain[0]) == b"p" * 100  # served from the SSD...
    assert not memory.contains(chain[1])  # ...but not promoted without its parent
    ssd.close()


class HookedTier(MemoryTier):
    """A lower tier that calls `before_delete` before deleting and can be told that reading
    its expiry fails: to interleave a lookup with a delete, or to break one call."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.before_delete: object = None
        self.ttl_fails = False

    def delete(self, key: str) -> bool:
        if callable(self.before_delete):
            self.before_delete(key)
        return super().delete(key)

    def ttl_left(self, key: str) -> float | None:
        if self.ttl_fails:
            raise ConnectionError("expiry read failed")
        return super().ttl_left(key)


def test_an_expiry_that_cannot_be_read_is_not_promoted_as_never() -> None:
    top, low = MemoryTier(1000, name="top"), HookedTier(1000, name="low")
    cache = HybridCache([top, low], write_through=["low"])
    cache.put(k("quote"), b"quote=100", ttl_s=5)
    low.ttl_fails = True
    assert cache.get(k("quote")) == b"quote=100"
    assert not top.contains(k("quote").to_string())  # not copied up without its expiry
    assert cache.metrics.value("preheat_cache_errors_total", tier="low", op="ttl") == 1


def test_a_renew_on_hit_ttl_is_forgotten_once_the_key_is_gone() -> None:
    cache = HybridCache([MemoryTier(200)])
    for i in range(50):  # each evicts the one before
        cache.put(e(f"s{i}"), b"x" * 150, ttl_s=60, ttl_mode="renew")
    for i in range(50):
        cache.get(e(f"s{i}"))
    assert len(cache._renew) == 1


def test_a_sessions_end_cools_only_what_no_other_session_read() -> None:
    cache = HybridCache([MemoryTier(40, policy="lru")])
    for name in ("system-prompt", "chat-a-history", "chat-b-history", "recent"):
        cache.put(e(name), b"x" * 10)
    cache.sessions.read(
        "acme", "a", [e(n).to_string() for n in ("system-prompt", "chat-a-history")]
    )
    cache.sessions.read(
        "acme", "b", [e(n).to_string() for n in ("system-prompt", "chat-b-history")]
    )
    cache.get(e("system-prompt"))
    cache.get(e("chat-a-history"))  # the most recently used, yet a's end makes it go first
    assert cache.end_session("globex", "a") == 0  # another tenant's session "a": nothing
    assert cache.end_session("acme", "a") == 1
    cache.put(e("new"), b"x" * 10)
    cache.put(e("newer"), b"x" * 10)
    assert cache.get(e("chat-a-history")) is None
    assert cache.get(e("chat-b-history")) is None  # then plain LRU order
    assert cache.get(e("system-prompt")) == b"x" * 10  # b read it too: never cooled

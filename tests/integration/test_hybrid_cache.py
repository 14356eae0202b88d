"""HybridCache over real tiers: order, promotion, demotion, TTL modes, invalidation, faults."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import FakeClock, wait_until
from prometheus_client import generate_latest

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey, PrefixKey
from cache_runtime.services import RedisServer
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

pytestmark = pytest.mark.integration


def k(prompt: str, tenant: str = "acme") -> ExactKey:
    return ExactKey.of(tenant, "tiny-gpt2", prompt)


@pytest.fixture
def three_tiers(tmp_path: Path, redis_url: str) -> Iterator[tuple[MemoryTier, SSDTier, RedisTier]]:
    client = redis_client(redis_url)
    client.flushdb()
    tiers = (MemoryTier(1000), SSDTier(tmp_path / "ssd", 10_000), RedisTier(client))
    yield tiers
    for tier in tiers:
        tier.close()


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
        assert cache.put(k(f"q{i}"), bytes([i]) * 300)  # memory holds 3 of them
    assert memory.stats().evictions == 7
    assert cache.metrics.value("preheat_cache_demotions_total", tier="ssd") == 7
    assert all(cache.get(k(f"q{i}")) == bytes([i]) * 300 for i in range(10))
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
    cache.put(k("system prompt"), b"s" * 50, pinned=True)
    for i in range(20):
        cache.put(k(f"q{i}"), b"x" * 30)
    assert cache.get(k("system prompt")) == b"s" * 50


def test_invalidate_then_refill_in_background(three_tiers: tuple) -> None:
    cache = HybridCache(three_tiers)
    cache.put(k("rate"), b"old rate")
    source = {"rate": b"new rate"}
    future = cache.invalidate(k("rate"), refill=lambda: source["rate"])
    assert cache.get(k("rate")) in (None, b"new rate")  # never the old value once it returned
    assert future is not None and future.result(timeout=10) is True
    assert cache.get(k("rate")) == b"new rate"
    assert all(t.get(k("rate").to_string()) == b"new rate" for t in three_tiers)
    failing = cache.invalidate(k("rate"), refill=lambda: 1 / 0)
    assert failing is not None and failing.result(timeout=10) is False
    assert cache.get(k("rate")) is None  # never the stale value
    assert cache.metrics.value("preheat_cache_refills_total", result="failed") == 1


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


def test_redis_killed_and_restarted_mid_test(tmp_path: Path) -> None:
    server = RedisServer().start()
    redis_tier = RedisTier(redis_client(server.url, socket_timeout_s=0.2))
    cache = HybridCache([MemoryTier(10_000), redis_tier])
    cache.put(k("before"), b"1")
    server.stop()  # killed mid-test
    assert cache.get(k("before")) == b"1"  # a local hit
    assert cache.get(k("unknown")) is None  # a miss, no exception
    assert cache.put(k("during"), b"2")  # memory still takes it
    assert redis_tier.stats().errors >= 2
    restarted = RedisServer(port=server.port).start()
    try:
        deadline_hits = [cache.put(k(f"after{i}"), b"3") for i in range(3)]
        assert all(deadline_hits)
        assert redis_tier.get(k("after2").to_string()) == b"3"  # the tier reconnected
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
        cache.put(k(name), b"x" * 10)
        cache.get(k(name))
    assert cache.cool([k("ended-chat")]) == 1
    cache.put(k("new"), b"x" * 10)
    assert cache.get(k("ended-chat")) is None
    assert cache.get(k("shared-system-prompt")) == b"x" * 10


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


class SlowTier(MemoryTier):
    """A lower tier whose reads wait for a signal: to interleave a lookup with invalidate."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.reading, self.release = threading.Event(), threading.Event()

    def get(self, key: str) -> bytes | None:
        value = super().get(key)
        self.reading.set()
        self.release.wait(10)
        return value


def test_invalidate_wins_over_a_lookup_already_in_flight() -> None:
    top, slow = MemoryTier(1000, name="top"), SlowTier(1000, name="slow")
    cache = HybridCache([top, slow], write_through=["slow"])
    cache.put(k("rate"), b"old rate")
    reader = threading.Thread(target=cache.get, args=(k("rate"),))
    reader.start()
    assert slow.reading.wait(10)  # the reader holds the old value and is about to promote it
    cache.invalidate(k("rate"))
    slow.release.set()
    reader.join(10)
    assert not top.contains(k("rate").to_string())  # the stale copy was not promoted
    assert cache.get(k("rate")) is None


def test_stale_demotion_and_superseded_refill_are_dropped() -> None:
    top, bottom = MemoryTier(1000, name="top"), MemoryTier(1000, name="bottom")
    cache = HybridCache([top, bottom], write_through=["top"])
    written_before = time.monotonic_ns()
    cache.invalidate(k("q"))
    top.on_evict(k("q").to_string(), b"stale", None, written_before)  # an eviction in flight
    assert not bottom.contains(k("q").to_string())
    gate = threading.Event()

    def slow_refill() -> bytes:
        gate.wait(10)
        return b"first"

    first = cache.invalidate(k("q"), refill=slow_refill)
    second = cache.invalidate(k("q"), refill=lambda: b"second")
    assert second.result(10) is True
    gate.set()
    assert first.result(10) is False  # superseded by the later invalidation
    assert cache.get(k("q")) == b"second"
    assert cache.metrics.value("preheat_cache_refills_total", result="superseded") == 1


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


def test_a_lookup_that_starts_during_invalidate_does_not_resurrect_the_old_value() -> None:
    """The lookup starts after invalidate's first fence and reads the lower tier before that
    tier's delete: its promotion into the already-cleared top tier must be dropped."""
    top, low = MemoryTier(1000, name="top"), HookedTier(1000, name="low")
    cache = HybridCache([top, low], write_through=["low"])
    cache.put(k("price"), b"price=100")
    seen: list[bytes | None] = []

    def read_during_delete(_: str) -> None:
        reader = threading.Thread(target=lambda: seen.append(cache.get(k("price"))))
        reader.start()
        reader.join(0.5)  # it reads the old value, then waits for the copy lock to promote

    low.before_delete = read_during_delete
    cache.invalidate(k("price"))
    low.before_delete = None
    wait_until(lambda: len(seen) == 1)
    assert not top.contains(k("price").to_string())
    assert cache.get(k("price")) is None


def test_a_copy_in_flight_never_lands_over_a_newer_put() -> None:
    """Promotion, demotion and refill of a value older than the key's last put are dropped."""
    top, slow = MemoryTier(1000, name="top"), SlowTier(1000, name="slow")
    cache = HybridCache([top, slow], write_through=["top", "slow"])
    slow.put(k("p").to_string(), b"price=100")  # only below: memory lost it
    reader = threading.Thread(target=cache.get, args=(k("p"),))
    reader.start()
    assert slow.reading.wait(10)  # holds price=100, about to promote it
    slow.release.set()  # later reads go straight through
    assert cache.put(k("p"), b"price=101")
    reader.join(10)
    assert cache.get(k("p")) == b"price=101"

    written_before = time.monotonic_ns()
    cache.put(k("q"), b"v2")
    top.on_evict(k("q").to_string(), b"v1", None, written_before)  # an older eviction
    assert slow.get(k("q").to_string()) == b"v2"

    gate = threading.Event()
    refill = cache.invalidate(k("r"), refill=lambda: gate.wait(10) and b"from source")
    assert cache.put(k("r"), b"newer put")
    gate.set()
    assert refill.result(10) is False
    assert cache.get(k("r")) == b"newer put"


def test_a_refused_put_leaves_no_older_value_anywhere() -> None:
    """A tier that refuses the new value drops its old one, and a put clears tiers outside
    `write_through`, so an older copy is never served once the new one is gone from above."""
    top, low = MemoryTier(1000, name="top"), MemoryTier(1000, name="low")
    cache = HybridCache([top, low], write_through=["low"])
    cache.put(k("limit"), b"limit=OK")
    assert cache.get(k("limit")) == b"limit=OK"  # promoted into top
    assert cache.put(k("limit"), b"limit=BREACHED")
    assert not top.contains(k("limit").to_string())  # the promoted copy went with the put
    assert cache.get(k("limit")) == b"limit=BREACHED"

    small, big = MemoryTier(100, name="small"), MemoryTier(10_000, name="big")
    cache = HybridCache([small, big])
    assert cache.put(k("doc"), b"v1" * 20)
    assert cache.put(k("doc"), b"v2" * 200)  # too big for `small`: refused there
    assert not small.contains(k("doc").to_string())
    assert small.stats().rejected == 1
    assert cache.get(k("doc")) == b"v2" * 200


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
        cache.put(k(f"s{i}"), b"x" * 150, ttl_s=60, ttl_mode="renew")
    for i in range(50):
        cache.get(k(f"s{i}"))
    assert len(cache._renew) == 1


def test_fences_are_bounded_but_a_pending_refill_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cache_runtime.fences as fences

    monkeypatch.setattr(fences, "_LIMIT", 100)
    monkeypatch.setattr(fences, "_TTL_NS", 0)  # every fence is old at once
    cache = HybridCache([MemoryTier(100_000)])
    gate = threading.Event()
    refill = cache.invalidate(k("pending"), refill=lambda: gate.wait(10) and b"fresh")
    for i in range(1000):
        cache.put(k(f"q{i}"), b"v")
    assert len(cache._fences) <= 101
    assert k("pending").to_string() in cache._fences
    gate.set()
    assert refill.result(10) is True  # not mistaken for superseded
    assert cache.get(k("pending")) == b"fresh"


def test_an_invalidation_that_redis_could_not_apply_is_not_served_later(redis_url: str) -> None:
    """Redis refuses writes for a moment (`CLIENT PAUSE ... WRITE`: reads still work) while a
    key is invalidated: the delete fails there, and the old value must stay unserved until a
    later delete gets through, not come back as a hit."""
    admin = redis_client(redis_url, socket_timeout_s=5)
    tier = RedisTier(redis_client(redis_url, socket_timeout_s=0.2), namespace="paused")
    cache = HybridCache([MemoryTier(10_000), tier])
    key = k("nav")
    assert cache.put(key, b"NAV=101.2 (yesterday)")
    admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        cache.invalidate(key)
        assert tier.stats().errors >= 1
        assert admin.get(tier.redis_key(key.to_string())) == b"NAV=101.2 (yesterday)"
        assert cache.get(key) is None  # still there in Redis, never served
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    # an access after the pause deletes it from Redis (retried at most every second), and
    # until then it is never served
    wait_until(
        lambda: cache.get(key) is None and admin.get(tier.redis_key(key.to_string())) is None
    )
    wait_until(lambda: cache.put(key, b"NAV=99.7 (today)"))
    assert cache.get(key) == b"NAV=99.7 (today)"


def test_invalidate_calls_no_tier_under_the_copy_lock() -> None:
    """A slow or failing tier delete must not stall every promotion and put (they take the
    copy lock), nor wait on a tier that waits on the copy lock (the SSD's demotions)."""
    top, low = MemoryTier(1000, name="top"), HookedTier(1000, name="low")
    cache = HybridCache([top, low], write_through=["low"])
    cache.put(k("q"), b"v")
    free: list[bool] = []

    def take_and_release() -> None:
        got = cache._copy_lock.acquire(timeout=5)
        free.append(got)
        if got:
            cache._copy_lock.release()

    def check_lock(_: str) -> None:
        taker = threading.Thread(target=take_and_release)
        taker.start()
        taker.join()

    low.before_delete = check_lock
    refill = cache.invalidate(k("q"), refill=lambda: b"fresh")
    assert free and all(free)
    assert refill.result(10) is True and cache.get(k("q")) == b"fresh"


def test_a_put_that_redis_could_not_apply_leaves_no_older_value_served(redis_url: str) -> None:
    """Redis refuses writes for a moment: the put's new value lands in memory only, and once
    memory loses it, Redis's older value must not be served (the key is a suspect there
    until a delete of it gets through)."""
    admin = redis_client(redis_url, socket_timeout_s=5)
    tier = RedisTier(redis_client(redis_url, socket_timeout_s=0.2), namespace="paused-put")
    memory = MemoryTier(10_000)
    cache = HybridCache([memory, tier])
    key = k("limit")
    assert cache.put(key, b"limit=OK")
    admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        assert cache.put(key, b"limit=BREACHED")  # memory took it, Redis did not
        assert admin.get(tier.redis_key(key.to_string())) == b"limit=OK"
        memory.delete(key.to_string())  # evicted, expired or a restart: memory lost it
        assert cache.get(key) is None  # never the older limit=OK
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    # the first access after the pause deletes the older value from Redis (retried each second)
    wait_until(
        lambda: (
            tier.get(key.to_string()) is None and admin.get(tier.redis_key(key.to_string())) is None
        )
    )
    wait_until(lambda: cache.put(key, b"limit=BREACHED") and bool(tier.get(key.to_string())))
    assert cache.get(key) == b"limit=BREACHED"


def test_an_answer_computed_before_an_invalidation_is_not_stored_after_it() -> None:
    """The gateway looks up, misses, generates, then puts: an invalidation (or another put)
    between its lookup and its put means the answer may come from the old source."""
    cache = HybridCache([MemoryTier(1000)])
    looked_up = time.monotonic_ns()
    cache.invalidate(k("rate"))  # the source changed while the model was generating
    assert not cache.put(k("rate"), b"rate from the old source", since_ns=looked_up)
    assert cache.get(k("rate")) is None
    assert (
        cache.metrics.value(
            "preheat_cache_writes_total", tier="all", kind="exact", result="superseded"
        )
        == 1
    )
    looked_up = time.monotonic_ns()
    assert cache.put(k("rate"), b"rate from the new source", since_ns=looked_up)
    assert cache.get(k("rate")) == b"rate from the new source"


def test_a_sessions_end_cools_only_what_no_other_session_read() -> None:
    cache = HybridCache([MemoryTier(40, policy="lru")])
    for name in ("system-prompt", "chat-a-history", "chat-b-history", "recent"):
        cache.put(k(name), b"x" * 10)
    cache.sessions.read(
        "acme", "a", [k(n).to_string() for n in ("system-prompt", "chat-a-history")]
    )
    cache.sessions.read(
        "acme", "b", [k(n).to_string() for n in ("system-prompt", "chat-b-history")]
    )
    cache.get(k("system-prompt"))
    cache.get(k("chat-a-history"))  # the most recently used, yet a's end makes it go first
    assert cache.end_session("globex", "a") == 0  # another tenant's session "a": nothing
    assert cache.end_session("acme", "a") == 1
    cache.put(k("new"), b"x" * 10)
    cache.put(k("newer"), b"x" * 10)
    assert cache.get(k("chat-a-history")) is None
    assert cache.get(k("chat-b-history")) is None  # then plain LRU order
    assert cache.get(k("system-prompt")) == b"x" * 10  # b read it too: never cooled


class SlowWriteTier(MemoryTier):
    """A tier whose puts wait for a signal before storing: to run an invalidation or a second
    put while a put's write is in flight."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.writing, self.release = threading.Event(), threading.Event()
        self.slow_values: set[bytes] = set()

    def put(self, key: str, value: bytes, **options: object) -> bool:
        if value in self.slow_values:
            self.writing.set()
            self.release.wait(10)
        return super().put(key, value, **options)  # type: ignore[arg-type]


def put_in_thread(cache: HybridCache, key: ExactKey, value: bytes, **options: object) -> Callable:
    """Start `cache.put` in a thread; returns a function that waits for and returns its result."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(cache.put(key, value, **options)))
    thread.start()

    def outcome() -> bool:
        thread.join(10)
        return result[0]

    return outcome


def test_a_put_still_writing_when_an_invalidation_runs_does_not_land_after_it() -> None:
    tier = SlowWriteTier(1000)
    cache = HybridCache([tier])
    tier.slow_values.add(b"rate from the old source")
    looked_up = time.monotonic_ns()
    outcome = put_in_thread(cache, k("rate"), b"rate from the old source", since_ns=looked_up)
    assert tier.writing.wait(10)  # past its fence check, its write not landed yet
    invalidation = threading.Thread(target=cache.invalidate, args=(k("rate"),))
    invalidation.start()  # the source changed
    invalidation.join(0.3)
    assert invalidation.is_alive()  # it waits for the put that began before it
    tier.release.set()
    invalidation.join(10)
    assert not invalidation.is_alive()
    assert cache.get(k("rate")) is None  # the late write was deleted before invalidate returned
    assert outcome() is False
    assert cache.metrics.value(
        "preheat_cache_writes_total", tier="all", kind="exact", result="superseded"
    )


def test_the_older_of_two_racing_puts_is_never_left_over_the_newer() -> None:
    tier = SlowWriteTier(1000)
    cache = HybridCache([tier])
    tier.slow_values.add(b"limit=100")
    older = put_in_thread(cache, k("limit"), b"limit=100")
    assert tier.writing.wait(10)
    assert cache.put(k("limit"), b"limit=50")  # the newer put lands first
    tier.release.set()  # then the older write lands over it
    assert older() is False
    assert cache.get(k("limit")) in (None, b"limit=50")  # a miss at worst, never limit=100

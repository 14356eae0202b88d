"""HybridCache invalidation: answers, templates and tenants, background refills, and the races
an invalidation must win (a lookup in flight, a write landing after it, a slower refill).

Split from test_hybrid_cache.py; the key helpers and the three-tier fixture are in
hybrid_cache_support.py."""

from __future__ import annotations

import threading

import pytest
from helpers import wait_until
from hybrid_cache_support import e, k

from cache_runtime.hybrid import HybridCache
from cache_runtime.tiers import MemoryTier

pytestmark = pytest.mark.integration


def test_invalidate_then_refill_in_background(three_tiers: tuple) -> None:
    cache = HybridCache(three_tiers)
    cache.put(k("rate"), b"old rate")
    source = {"rate": b"new rate"}
    future = cache.invalidate(k("rate"), refill=lambda: source["rate"])
    assert cache.get(k("rate")) in (None, b"new rate")  # never the old value once it returned
    assert future is not None and future.result(timeout=10) is True
    assert cache.get(k("rate")) == b"new rate"
    assert all(t.get(k("rate").to_string()).endswith(b"\nnew rate") for t in three_tiers)
    failing = cache.invalidate(k("rate"), refill=lambda: 1 / 0)
    assert failing is not None and failing.result(timeout=10) is False
    assert cache.get(k("rate")) is None  # never the stale value
    assert cache.metrics.value("preheat_cache_refills_total", result="failed") == 1


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
    served: list[bytes | None] = []
    reader = threading.Thread(target=lambda: served.append(cache.get(k("rate"))))
    reader.start()
    assert slow.reading.wait(10)  # the reader holds the old copy, about to check its stamp
    cache.invalidate(k("rate"))
    slow.release.set()
    reader.join(10)
    assert served == [None] and not top.contains(k("rate").to_string())  # not promoted either
    assert cache.get(k("rate")) is None


def test_an_answer_computed_before_an_invalidation_is_not_stored_after_it() -> None:
    """The gateway looks up, misses, generates, then puts with the generations it read: an
    invalidation between its lookup and its put means the answer may come from the old
    source, and it is not stored."""
    cache = HybridCache([MemoryTier(1000)])
    looked_up = cache.lookup(k("rate"))
    assert looked_up.value is None and looked_up.generations is not None
    cache.invalidate(k("rate"))  # the source changed while the model was generating
    assert not cache.put(k("rate"), b"old source", generations=looked_up.generations)
    assert cache.get(k("rate")) is None
    superseded = cache.metrics.value(
        "preheat_cache_writes_total", tier="all", kind="exact", result="superseded"
    )
    assert superseded == 1
    fresh = cache.lookup(k("rate")).generations
    assert cache.put(k("rate"), b"new source", generations=fresh)
    assert cache.get(k("rate")) == b"new source"


class SlowWriteTier(MemoryTier):
    """A tier whose puts of values ending in `slow_suffix` wait for a signal: a write in flight
    while an invalidation runs (a slow SSD, a Redis that stalls)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.writing, self.release = threading.Event(), threading.Event()
        self.slow_suffix = b"\x00never"

    def put(self, key: str, value: bytes, **options: object) -> bool:
        if value.endswith(self.slow_suffix):
            self.writing.set()
            self.release.wait(10)
        return super().put(key, value, **options)  # type: ignore[arg-type]


def test_a_write_that_lands_after_an_invalidation_is_never_served() -> None:
    tier = SlowWriteTier(1000)
    cache = HybridCache([tier])
    tier.slow_suffix = b"old source"
    stamp = cache.lookup(k("rate")).generations
    result: list[bool] = []
    writer = threading.Thread(
        target=lambda: result.append(cache.put(k("rate"), b"old source", generations=stamp))
    )
    writer.start()
    assert tier.writing.wait(10)  # past its generation check, its write not landed yet
    cache.invalidate(k("rate"))  # returns at once: nothing to wait for
    assert cache.get(k("rate")) is None
    tier.release.set()
    writer.join(10)
    assert result == [True] and tier.contains(k("rate").to_string())  # it landed...
    assert cache.get(k("rate")) is None  # ...and is never served: its stamp is old
    assert not tier.contains(k("rate").to_string())  # dropped by that lookup


def test_invalidating_a_template_or_a_tenant_reaches_only_its_answers() -> None:
    cache = HybridCache([MemoryTier(10_000)])
    for prompt, template in (("a", "rates"), ("b", "cards"), ("c", None)):
        assert cache.put(k(prompt), prompt.encode(), template=template)
    assert cache.put(k("a", "globex"), b"g", template="rates") and cache.put(e("a"), b"v")
    cache.invalidate_template("acme", "rates")
    assert cache.get(k("a"), template="rates") is None
    assert cache.get(k("b"), template="cards") == b"b" and cache.get(k("c")) == b"c"
    assert cache.get(k("a", "globex"), template="rates") == b"g"  # another tenant's template
    assert cache.get(k("b")) is None  # looked up under another template: not the same answer
    cache.invalidate_tenant("acme")
    assert cache.get(k("b"), template="cards") is None and cache.get(k("c")) is None
    assert cache.get(k("a", "globex"), template="rates") == b"g" and cache.get(e("a")) == b"v"


def test_a_superseded_refill_is_dropped() -> None:
    cache = HybridCache([MemoryTier(1000)])
    gate = threading.Event()

    def slow_refill() -> bytes:
        gate.wait(10)
        return b"first"

    first = cache.invalidate(k("q"), refill=slow_refill)
    assert first is not None
    misses = {"tier": "memory", "kind": "exact", "result": "miss"}
    # the first refill has read its generations and is computing
    wait_until(lambda: cache.metrics.value("preheat_cache_lookups_total", **misses) >= 1)
    second = cache.invalidate(k("q"), refill=lambda: b"second")
    assert second is not None and second.result(10) is True
    gate.set()
    assert first.result(10) is False  # computed under the generation before the second
    assert cache.get(k("q")) == b"second"

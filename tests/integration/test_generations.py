"""`generations.py`: one protocol, two implementations, one suite (plus Redis's own failures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_until

from cache_runtime.generations import (
    AnswerScope,
    GenerationsUnavailable,
    LocalGenerations,
    RedisGenerations,
    template_counter,
    tenant_counter,
)
from cache_runtime.keys import EmbeddingKey, ExactKey, SemanticKey
from cache_runtime.services import RedisServer
from cache_runtime.tiers import redis_client

pytestmark = pytest.mark.integration


def scope(prompt: str, tenant: str = "acme", template: str | None = "rates") -> AnswerScope:
    return AnswerScope.of(ExactKey.of(tenant, "m", prompt).to_string(), template)


@pytest.fixture(params=["local", "redis"])
def generations(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Any]:
    if request.param == "local":
        yield LocalGenerations()
        return
    client = redis_client(redis_url, socket_timeout_s=5)
    client.flushdb()
    yield RedisGenerations(client, namespace="gen-test")
    client.close()


def test_a_stamp_holds_until_one_of_its_three_counters_moves(generations: Any) -> None:
    a, b = scope("a"), scope("b")
    first = generations.read(a)[0]
    assert first is not None and generations.read(a)[0] == first  # reading changes nothing
    generations.bump(("key", b.key))
    assert generations.read(a)[0] == first  # another key's invalidation
    generations.bump(("key", a.key))
    second = generations.read(a)[0]
    assert second != first
    generations.bump(template_counter("acme", "cards"))
    assert generations.read(a)[0] == second  # another template
    b_before = generations.read(b)[0]
    generations.bump(template_counter("acme", "rates"))
    third = generations.read(a)[0]
    assert third != second and generations.read(b)[0] != b_before  # every answer of the template
    generations.bump(tenant_counter("globex"))
    assert generations.read(a)[0] == third  # another tenant
    generations.bump(tenant_counter("acme"))
    assert generations.read(a)[0] != third


def test_tenants_and_templates_with_separators_never_share_a_counter(generations: Any) -> None:
    """Tenant `a|b` with template `c` and tenant `a` with template `b|c` are different scopes."""
    one = scope("q", tenant="a|b", template="c")
    other = scope("q", tenant="a", template="b|c")
    before = generations.read(other)[0]
    generations.bump(template_counter("a|b", "c"))
    assert generations.read(other)[0] == before and generations.read(one)[0] is not None


def test_only_answer_keys_have_a_scope() -> None:
    assert AnswerScope.of(SemanticKey("acme", "t@m", 5).to_string()).template == "untemplated"
    with pytest.raises(ValueError, match="not an answer key"):
        AnswerScope.of(EmbeddingKey.of("acme", "minilm", "text").to_string())
    with pytest.raises(ValueError, match="not an answer key"):
        AnswerScope.of("anything else")


def test_counters_lost_with_redis_never_match_an_old_stamp(redis_url: str) -> None:
    """A Redis restarted empty (here: flushed) starts every counter at a new random value, so
    a stamp read before can never be current again, even for counters that had been bumped."""
    client = redis_client(redis_url, socket_timeout_s=5)
    generations = RedisGenerations(client, namespace="gen-lost")
    a = scope("a")
    generations.bump(("key", a.key))  # created by an increment: from a random start too
    stamps = {generations.read(a)[0]}
    for _ in range(20):
        client.flushdb()
        generations.bump(("key", a.key))
        stamp = generations.read(a)[0]
        assert stamp not in stamps
        stamps.add(stamp)
    client.close()


def test_without_redis_reads_say_so_and_an_invalidation_raises() -> None:
    server = RedisServer().start()
    client = redis_client(server.url, socket_timeout_s=0.2)
    generations = RedisGenerations(client, namespace="gen-down", retry_s=0.05)
    assert generations.read(scope("a"))[0] is not None and generations.problem() is None
    server.stop()
    assert generations.read(scope("a")) == (None, None)
    assert "redis unreachable" in str(generations.problem())
    with pytest.raises(GenerationsUnavailable, match="did not happen"):
        generations.bump(("key", scope("a").key))
    restarted = RedisServer(port=server.port).start()
    try:
        wait_until(lambda: generations.problem() is None)  # a live probe, after `retry_s`
        assert generations.read(scope("a"))[0] is not None
    finally:
        restarted.stop()
        client.close()


def test_a_local_counter_forgotten_past_the_limit_restarts_elsewhere() -> None:
    generations = LocalGenerations(limit=6)
    first = generations.read(scope("a"))[0]
    for i in range(10):
        generations.read(scope(f"other {i}"))
    assert generations.read(scope("a"))[0] != first  # a miss, never an old answer

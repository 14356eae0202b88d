"""The gateway end to end, invalidation: only the admin key invalidates, per tenant, by key, by
request, by template or all at once, and an invalidated answer is served by no path, exact or
semantic. (The setting: test_gateway.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from gateway_support import MODEL_ANSWERED, Running, chat, unique

from cache_runtime.kv_pages import PAGE_TOKENS, page_keys
from flows.gateway import CACHE_HEADER, KEY_HEADER

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


def test_invalidation_needs_the_admin_key_and_is_per_tenant(gw: Running) -> None:
    content = unique("What are the branch opening hours?")
    chat(gw, content)
    chat(gw, content, key="sk-beta-1")
    request = {"messages": [{"role": "user", "content": content}], "temperature": 0}

    assert gw.admin({"tenant": "acme", "request": request}, key=None).status_code == 401
    assert gw.admin({"tenant": "acme", "request": request}, key="sk-acme-1").status_code == 403
    assert gw.admin({"tenant": "nobody", "request": request}).status_code == 400
    assert gw.admin({"tenant": "acme", "all": True, "request": request}).status_code == 400
    done = gw.admin({"tenant": "acme", "request": request})

    assert done.status_code == 200 and done.json()["held"] is True
    # answered by the model again (its KV pages may be reused: they never go stale)
    assert chat(gw, content)[0] in MODEL_ANSWERED
    assert chat(gw, content, key="sk-beta-1")[0] == "exact-memory"  # beta's answer stays


def _paraphrased(content: str) -> str:
    return content.replace("How long does", "How long will")


@pytest.mark.parametrize("by", ["key", "request", "template_id", "all"])
def test_each_way_of_invalidating_makes_the_same_and_a_paraphrased_request_miss(
    gw: Running, by: str
) -> None:
    """An answer invalidated by its key, by its request, by its template or with all of its
    tenant's answers is served by no path: not exact, not to a verified paraphrase."""
    content = unique("How long does a SEPA transfer take to arrive?")
    client = gw.client()
    raw = client.chat.completions.with_raw_response.create(
        model=gw.model, messages=[{"role": "user", "content": content}], temperature=0
    )
    assert raw.headers[CACHE_HEADER] == "miss"
    assert chat(gw, content)[0] == "exact-memory"
    assert chat(gw, _paraphrased(content))[0] == "semantic-memory"  # both paths serve it
    other = unique("Which documents do I need to open a savings account?")
    chat(gw, other)
    body: dict[str, Any] = {
        "key": {"key": raw.headers[KEY_HEADER]},
        "request": {"request": {"messages": [{"role": "user", "content": content}],
                                "temperature": 0}},
        "template_id": {"template_id": "untemplated"},
        "all": {"all": True},
    }[by]  # fmt: skip
    done = gw.admin({"tenant": "acme", **body})

    assert done.status_code == 200 and done.json()["invalidated"] == by
    assert chat(gw, _paraphrased(content))[0] in MODEL_ANSWERED  # the next paraphrase misses
    still = "exact-memory" if by in ("key", "request") else MODEL_ANSWERED
    assert chat(gw, other)[0] in still  # only what was invalidated goes
    # an answer computed since is current: served again (exact, or the paraphrase's answer),
    # then invalidated again
    chat(gw, content)
    assert chat(gw, content)[0] in ("exact-memory", "semantic-memory")
    assert gw.admin({"tenant": "acme", **body}).status_code == 200
    assert chat(gw, content)[0] in MODEL_ANSWERED  # the next identical request misses


def test_an_invalidation_of_a_key_of_another_tenant_or_kind_is_refused(gw: Running) -> None:
    raw = gw.client().chat.completions.with_raw_response.create(
        model=gw.model, messages=[{"role": "user", "content": unique("Card fees?")}], temperature=0
    )
    key = raw.headers[KEY_HEADER]
    assert gw.admin({"tenant": "acme", "key": key.replace("|acme|", "|beta|")}).status_code == 400
    assert gw.admin({"tenant": "acme", "key": "ph|v1|exact|acme"}).status_code == 400
    page = page_keys("acme", gw.model, list(range(PAGE_TOKENS)))[0].to_string()
    assert gw.admin({"tenant": "acme", "key": page}).status_code == 400  # KV pages never go stale

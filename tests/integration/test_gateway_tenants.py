"""The gateway end to end, tenants and keys: one tenant never reads another's answers or KV
pages, a session's end cools only its own pages, unknown keys are refused; and a request that
opts out of the cache neither reads nor stores. (The setting and the marker answers:
test_gateway.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from gateway_support import (
    ADMIN,
    EMBEDDING_MODEL,
    MARKER,
    MODEL_ANSWERED,
    Running,
    chat,
    chat_key,
    complete,
    unique,
)

from cache_runtime.keys import ExactKey
from cache_runtime.kv_pages import PAGE_TOKENS, page_keys
from flows.gateway import CACHE_HEADER

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


# -- tenants and keys -----------------------------------------------------------------------------


def test_one_tenant_never_receives_another_tenants_cached_answer(gw: Running) -> None:
    content = unique("What is my current mortgage balance?")
    paraphrase = content.replace("What is", "What's")
    key = chat_key(gw, "acme", content).to_string()
    gw.cache.put(key, MARKER.encode())
    stamp = gw.cache.lookup(key).generations
    semantic = gw.app.state.gateway.chain.semantic  # a verified entry only acme may see
    semantic.store(
        "acme", gw.model, f"{gw.model}#", content, None, (MARKER, "stop", 6), (key, stamp)
    )

    acme_source, acme = chat(gw, content)
    acme_near_source, acme_near = chat(gw, paraphrase)
    beta_source, beta = chat(gw, content, key="sk-beta-1")
    beta_near_source, beta_near = chat(gw, paraphrase, key="sk-beta-1")

    assert acme_source == "exact-memory" and acme.choices[0].message.content == MARKER
    assert acme_near_source == "semantic-memory" and acme_near.choices[0].message.content == MARKER
    assert beta_source == "miss" and beta.choices[0].message.content != MARKER
    assert beta_near.choices[0].message.content != MARKER  # (beta's own entry may answer it)
    assert beta_near_source in ("semantic-memory", "miss")


def test_kv_pages_of_one_tenant_are_no_prefix_hit_for_another(gw: Running) -> None:
    prefix = unique("Our bank's policy on wire transfers, in full detail. " * 5)
    sampled = {"temperature": 0.7}  # no response cache: only KV pages can be reused
    assert complete(gw, prefix, **sampled)[0] == "miss"
    assert complete(gw, prefix + " And for acme?", **sampled)[0] == "prefix"
    beta_source, beta = complete(gw, prefix + " And for beta?", key="sk-beta-1", **sampled)
    assert beta_source == "miss" and beta.usage.prompt_tokens_details.cached_tokens == 0


def test_ending_a_session_cools_the_pages_only_it_read(gw: Running, backend: Any) -> None:
    """Two conversations share a system prompt; ending one cools its own pages, not the
    shared ones, and only under the tenant that owns the session."""
    system = unique("You are the assistant of a retail bank; answer in one line. " * 3)
    own = {name: f"{system} Question of chat {name}: " + f"{name} details, " * 12 for name in "ab"}
    for name, prompt in own.items():
        raw = gw.client().completions.with_raw_response.create(
            model=gw.model, prompt=prompt, temperature=0.7,
            extra_headers={"x-preheat-session": f"chat-{name}"},
        )  # fmt: skip
        assert raw.headers[CACHE_HEADER] in MODEL_ANSWERED
    pages = {
        name: [
            k.to_string()
            for k in page_keys("acme", gw.model, backend.encode(p))[
                : len(backend.encode(p)) // PAGE_TOKENS
            ]
        ]
        for name, p in own.items()
    }
    private_a = [key for key in pages["a"] if key not in pages["b"]]
    assert 0 < len(private_a) < len(pages["a"])  # some pages are shared, some are a's own

    def end(session: str, key: str = "sk-acme-1") -> httpx.Response:
        return httpx.post(
            f"{gw.url}/v1/sessions/end", json={"session": session},
            headers={"Authorization": f"Bearer {key}"}, timeout=30,
        )  # fmt: skip

    assert end("chat-a", key="sk-beta-1").json() == {"session": "chat-a", "cooled": 0}
    assert end("chat-a").json() == {"session": "chat-a", "cooled": len(private_a)}
    assert end("chat-a").json()["cooled"] == 0  # ended already
    assert end("chat-b", key="wrong").status_code == 401
    for bad in ("", "s" * 129, "two words", "café"):
        assert end(bad).status_code == 400
    for bad_header in ("s" * 129, "two words"):
        with pytest.raises(openai.BadRequestError):
            gw.client().completions.create(
                model=gw.model, prompt="x", extra_headers={"x-preheat-session": bad_header}
            )

    # a warmed system prompt is read by nobody's session: no session's end cools it
    warmed = unique("You are the desk assistant of a private bank; be exact. " * 3)
    backend.warm_prefix("acme", warmed, gw.cache)
    prompt = warmed + " My own question, " + "with my details, " * 12
    gw.client().completions.create(
        model=gw.model, prompt=prompt, temperature=0.7,
        extra_headers={"x-preheat-session": "chat-c"},
    )  # fmt: skip
    tokens = backend.encode(prompt)
    own = page_keys("acme", gw.model, tokens)[: len(tokens) // PAGE_TOKENS]
    warmed_tokens = backend.encode(warmed)
    shared = page_keys("acme", gw.model, warmed_tokens)[: len(warmed_tokens) // PAGE_TOKENS]
    assert end("chat-c").json()["cooled"] == len(own) - len(shared) > 0


def test_unknown_or_missing_keys_get_401_and_admin_keys_make_no_requests(gw: Running) -> None:
    prompt = unique("What is the routing number?")
    with pytest.raises(openai.AuthenticationError):
        complete(gw, prompt, key="sk-acme-2")
    with pytest.raises(openai.AuthenticationError):
        chat(gw, prompt, key="sk-acme-1x")
    with pytest.raises(openai.AuthenticationError):
        gw.client("wrong").embeddings.create(model=EMBEDDING_MODEL, input="x")
    with pytest.raises(openai.PermissionDeniedError):
        complete(gw, prompt, key=ADMIN)
    body = {"model": gw.model, "prompt": prompt}
    assert httpx.post(f"{gw.url}/v1/completions", json=body).status_code == 401
    assert httpx.post(f"{gw.url}/v1/completions", content=b"not json").status_code == 401


# -- opting out -----------------------------------------------------------------------------------


def test_opting_out_in_the_body_neither_reads_nor_stores(gw: Running) -> None:
    seeded, fresh = unique("Close my savings account."), unique("Open a savings account.")
    gw.cache.put(ExactKey.of("acme", gw.model, seeded), MARKER.encode())
    source, answer = complete(gw, seeded, extra_body={"cache": False})
    fresh_source, _ = complete(gw, fresh, extra_body={"cache": False})
    after_source, _ = complete(gw, fresh)

    assert source == "bypass" and answer.choices[0].text != MARKER
    assert fresh_source == "bypass" and after_source == "miss"  # the bypassed answer was not kept


def test_opting_out_with_the_header_neither_reads_nor_stores(gw: Running) -> None:
    content = unique("Freeze my credit card.")
    gw.cache.put(chat_key(gw, "acme", content), MARKER.encode())
    source, answer = chat(gw, content, extra_headers={CACHE_HEADER: "off"})
    other = unique("Unfreeze my credit card.")
    other_source, _ = chat(gw, other, extra_headers={CACHE_HEADER: "off"})

    assert source == "bypass" and answer.choices[0].message.content != MARKER
    assert other_source == "bypass" and chat(gw, other)[0] == "miss"
    embedded = gw.client().embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL, input=other, extra_body={"cache": False}
    )
    assert embedded.headers[CACHE_HEADER] == "bypass"

"""The gateway end to end: uvicorn on a free loopback port, the tiny GPT-2 in process, a real
Redis, and the official `openai` client.

The model's text is meaningless (random weights) and the same for every tenant, so tests that
must tell a cached answer from a fresh one seed a marker answer straight into the cache under the
key the gateway reads: serving the marker proves the cache answered, not serving it proves it
did not.

This file: hits, misses and streaming. The other themes are test_gateway_*.py; their shared
helpers are gateway_support.py's, their fixtures (a model, MiniLM, a gateway per module)
gateway_fixtures.py's.
"""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

# backend, minilm, EMBEDDING_MODEL and start are not used here: test_gateway_conformance imports
# them from this module, where they were before the split
from gateway_fixtures import backend, minilm  # noqa: F401
from gateway_support import (  # noqa: F401
    EMBEDDING_MODEL,
    MARKER,
    MODEL_ANSWERED,
    Running,
    chat,
    complete,
    start,
    streamed_chat,
    unique,
)

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey, parse_key
from cache_runtime.tiers import RedisTier, redis_client
from flows.gateway import CACHE_HEADER, KEY_HEADER

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


def test_a_miss_is_stored_and_the_same_request_is_then_an_exact_hit(gw: Running) -> None:
    prompt = unique("What is the fee for an international wire transfer?")
    first_source, first = complete(gw, prompt)
    raw = gw.client().completions.with_raw_response.create(
        model=gw.model, prompt=prompt, temperature=0
    )
    second = raw.parse()

    assert first_source == "miss" and raw.headers[CACHE_HEADER] == "exact-memory"
    assert second.choices[0].text == first.choices[0].text != ""
    assert second.choices[0].finish_reason == first.choices[0].finish_reason
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    key = parse_key(raw.headers[KEY_HEADER])
    assert key == ExactKey.of("acme", gw.model, prompt)
    # written through to the shared Redis tier: another node reads the same answer
    shared = HybridCache([RedisTier(redis_client(str(gw.redis_url)), namespace=gw.namespace)])
    assert shared.get(key) == first.choices[0].text.encode()
    shared.close()


def test_chat_hits_and_a_stream_of_a_hit_reassembles_to_the_same_text(gw: Running) -> None:
    content = unique("How do I order a replacement debit card?")
    source, first = chat(gw, content)
    stream_source, text, chunks = streamed_chat(gw, content, stream_options={"include_usage": True})

    assert source == "miss" and stream_source == "exact-memory"
    assert text == first.choices[0].message.content != ""
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == first.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert len(chunks) > 3  # really in pieces, not one chunk


def test_a_streamed_miss_is_stored(gw: Running) -> None:
    content = unique("Can I raise the daily limit on my card?")
    stream_source, text, _ = streamed_chat(gw, content)
    source, answer = chat(gw, content)

    assert stream_source == "miss" and source == "exact-memory"
    assert answer.choices[0].message.content == text != ""


def test_a_streamed_miss_arrives_token_by_token_and_is_stored_whole(gw: Running) -> None:
    """The model's text goes out as it is decoded (a chunk per token or so, not the finished
    answer cut in pieces), and the same answer, whole, is what the next request gets."""
    content = unique("Summarise the terms of a fixed-rate savings bond.")
    stream_source, text, chunks = streamed_chat(gw, content, max_tokens=60)
    source, answer = chat(gw, content, max_tokens=60)

    assert stream_source == "miss" and source == "exact-memory"
    assert answer.choices[0].message.content == text != ""
    contents = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(contents) >= 20  # one per decoded token, give or take a character's bytes
    assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason


def test_a_stop_sequence_ends_a_stream_where_a_plain_answer_ends(gw: Running) -> None:
    content = unique("Describe the steps of a loan application.")
    _, whole = chat(gw, content, max_tokens=40)
    full = whole.choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # somewhere in the middle
    assert stop and full.find(stop) > 0
    source, text, chunks = streamed_chat(gw, content, max_tokens=40, stop=[stop])
    _, plain = chat(gw, content, max_tokens=40, stop=[stop])

    assert source in MODEL_ANSWERED  # another variant: its own answer, decoded as it streams
    assert text == full[: full.find(stop)] == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_client_that_leaves_mid_stream_stops_the_model_and_nothing_is_stored(
    gw: Running,
) -> None:
    content = unique("Write out the full fee schedule for every account type.")
    body = {"model": gw.model, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": 400, "stream": True}  # fmt: skip
    headers = {"Authorization": "Bearer sk-acme-1"}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, headers=headers,
                      timeout=30) as reply:  # fmt: skip
        assert reply.headers[CACHE_HEADER] == "miss"
        for line in reply.iter_lines():
            if '"content":' in line and '"content":""' not in line:
                break  # the first decoded text: leave
    # the model stopped: the next request is answered (the model's lock is free) and the
    # abandoned answer, incomplete, was not stored
    source, answer = chat(gw, content, max_tokens=400)
    assert source in MODEL_ANSWERED and answer.choices[0].message.content is not None


def test_streamed_completions_end_with_done(gw: Running) -> None:
    prompt = unique("List the documents needed for a mortgage application.")
    _, plain = complete(gw, prompt)
    body = {"model": gw.model, "prompt": prompt, "temperature": 0, "stream": True}
    headers = {"Authorization": "Bearer sk-acme-1"}
    reply = httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers, timeout=30)

    events = [e for e in reply.text.split("\n\n") if e]
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    pieces = [orjson.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert {p["object"] for p in pieces} == {"text_completion"}
    assert "".join(p["choices"][0]["text"] for p in pieces) == plain.choices[0].text


def test_only_greedy_requests_with_the_same_parameters_share_an_answer(gw: Running) -> None:
    prompt = unique("Explain the difference between APR and APY.")
    gw.cache.put(ExactKey.of("acme", gw.model, prompt), MARKER.encode())
    greedy_source, greedy = complete(gw, prompt)
    sampled = [complete(gw, prompt, temperature=0.8) for _ in range(2)]
    longer_source, longer = complete(gw, prompt, max_tokens=20)
    stop_source, _ = complete(gw, prompt, stop=["."])

    assert greedy_source == "exact-memory" and greedy.choices[0].text == MARKER
    assert all(s in ("miss", "prefix") and a.choices[0].text != MARKER for s, a in sampled)
    assert longer_source in ("miss", "prefix") and longer.choices[0].text != MARKER
    assert longer.usage.completion_tokens <= 20
    assert stop_source in ("miss", "prefix")  # same prompt, another stop list: another answer


def test_a_parameter_the_in_process_model_cannot_honour_is_refused(gw: Running) -> None:
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        complete(gw, unique("Is my card blocked?"), logit_bias={"5": 10})

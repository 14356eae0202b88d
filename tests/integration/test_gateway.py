"""The gateway end to end: uvicorn on a free loopback port, the tiny GPT-2 in process, a real
Redis, and the official `openai` client.

The model's text is meaningless (random weights) and the same for every tenant, so tests that
must tell a cached answer from a fresh one seed a marker answer straight into the cache under the
key the gateway reads: serving the marker proves the cache answered, not serving it proves it
did not.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import redis

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey, parse_key
from cache_runtime.kv_pages import PAGE_TOKENS, page_keys
from cache_runtime.services import RedisServer
from cache_runtime.tiers import RedisTier, redis_client
from flows.gateway import CACHE_HEADER, KEY_HEADER, GatewayConfig, create_app
from flows.gateway.config import DEFAULT_SEMANTIC_THRESHOLD
from models.serving.embeddings import MiniLM
from models.serving.runners import InProcessRunner
from models.templates.guards import guards_pass
from models.templates.semantic import normalise

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

KEYS = {"sk-acme-1": "acme", "sk-beta-1": "beta"}
ADMIN = "sk-admin-1"
MARKER = "CACHED ANSWER FOR ACME ONLY"
EMBEDDING_MODEL = "all-minilm-l6-v2"
MODEL_ANSWERED = ("miss", "prefix")  # no stored answer was served


@dataclass
class Running:
    url: str
    app: Any
    model: str
    redis_url: str | None
    namespace: str
    stream: str

    def client(self, key: str = "sk-acme-1") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60)

    @property
    def cache(self) -> HybridCache:
        return self.app.state.gateway.cache

    def admin(self, body: dict[str, Any], key: str | None = ADMIN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{self.url}/admin/invalidate", json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from models.llm.backends import HFBackend
    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    directory = save_tiny_llm(tmp_path_factory.mktemp("llm") / "tiny-gpt2")
    backend = HFBackend.from_path(directory, device="cpu")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM(device="cpu")


def start(
    backend: Any,
    minilm: MiniLM,
    data_dir: Path,
    redis_url: str | None,
    inject: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[Running, Any]:
    """A gateway over the shared model and MiniLM, in its own Redis namespace and stream
    (`options`: more `GatewayConfig` fields; `inject`: more parts for `create_app`)."""
    from models.llm.openai_server import serve_in_thread

    namespace, stream = f"gw-{uuid.uuid4().hex[:8]}", f"gw-requests-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {
        "keys": KEYS, "admin_keys": [ADMIN], "data_dir": data_dir, "redis_url": redis_url,
        "redis_namespace": namespace, "request_stream": stream, "memory_bytes": 32 << 20,
        "ssd_bytes": 64 << 20, "templates": False, **options,
    }  # fmt: skip
    config = GatewayConfig(**settings)
    app = create_app(config, runner=InProcessRunner(backend), minilm=minilm, **(inject or {}))
    url, stop = serve_in_thread(app)
    return Running(url, app, backend.model_id, redis_url, namespace, stream), stop


@pytest.fixture(scope="module")
def gw(
    backend: Any, minilm: MiniLM, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    running, stop = start(backend, minilm, tmp_path_factory.mktemp("gw"), redis_url)
    yield running
    stop()


def unique(text: str) -> str:
    """`text` made particular to one test, so no test sees another's entries."""
    return f"Case {uuid.uuid4().hex[:6]}: {text}"


def complete(gw: Running, prompt: str, key: str = "sk-acme-1", **options: Any) -> tuple[str, Any]:
    """(x-preheat-cache, the parsed completion); greedy unless `temperature` is given."""
    options.setdefault("temperature", 0)
    raw = gw.client(key).completions.with_raw_response.create(
        model=gw.model, prompt=prompt, **options
    )
    return raw.headers[CACHE_HEADER], raw.parse()


def chat(gw: Running, content: str, key: str = "sk-acme-1", **options: Any) -> tuple[str, Any]:
    options.setdefault("temperature", 0)
    raw = gw.client(key).chat.completions.with_raw_response.create(
        model=gw.model, messages=[{"role": "user", "content": content}], **options
    )
    return raw.headers[CACHE_HEADER], raw.parse()


def streamed_chat(gw: Running, content: str, **options: Any) -> tuple[str, str, list[Any]]:
    """(x-preheat-cache, the text the chunks join to, the chunks)"""
    with gw.client().chat.completions.with_streaming_response.create(
        model=gw.model, messages=[{"role": "user", "content": content}], temperature=0,
        stream=True, **options,
    ) as response:  # fmt: skip
        chunks = list(response.parse())
        source = response.headers[CACHE_HEADER]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return source, text, chunks


def chat_key(gw: Running, tenant: str, content: str) -> ExactKey:
    """Where a default (greedy, 16-token) chat answer of the tiny model is stored: its prompt
    is the chat rendered as the model reads it."""
    return ExactKey.of(tenant, gw.model, f"user: {content}\nassistant:")


# -- hits, misses, streaming --------------------------------------------------------------------


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


def test_warm_up_responses_and_kv_pages_are_what_the_gateway_serves(
    gw: Running, backend: Any
) -> None:
    """Warm-up writes with the backend into the node cache; the gateway reads the same keys."""
    prompt = unique("Summarise the overdraft policy for premium accounts. " * 4)
    warmed = backend.warm_prefix("acme", prompt, gw.cache, store_response=True)
    source, answer = complete(gw, prompt)  # default max_tokens: warm-up's 16
    longer_source, longer = complete(gw, prompt + " Answer in French.")

    assert source == "exact-memory" and answer.choices[0].text == warmed.response
    assert longer_source == "prefix"
    assert longer.usage.prompt_tokens_details.cached_tokens >= PAGE_TOKENS


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


# -- embeddings -------------------------------------------------------------------------------


def test_embeddings_are_minilm_and_cached_per_input(gw: Running, minilm: MiniLM) -> None:
    texts = [unique("savings account interest"), unique("credit card annual fee")]
    client = gw.client()
    first = client.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=texts[0])
    both = client.embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL, input=texts, encoding_format="float"
    )

    assert first.headers[CACHE_HEADER] == "miss"
    assert both.headers[CACHE_HEADER] == "exact-memory,miss"
    vectors = np.array([d.embedding for d in both.parse().data], dtype=np.float32)
    np.testing.assert_allclose(vectors, minilm.encode(texts), atol=1e-5)
    np.testing.assert_allclose(first.parse().data[0].embedding, vectors[0], atol=1e-6)
    assert both.parse().usage.prompt_tokens == sum(minilm.count(texts))


# -- tenants and keys ---------------------------------------------------------------------------


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


# -- opting out ---------------------------------------------------------------------------------


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


# -- invalidation -------------------------------------------------------------------------------


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


# -- semantic -----------------------------------------------------------------------------------


def test_a_verified_paraphrase_hits_and_a_changed_number_does_not(
    gw: Running, minilm: MiniLM
) -> None:
    case = uuid.uuid4().hex[:6]
    stored = f"How do I reset my online banking password? Ref {case}"
    paraphrase = f"How can I reset my online banking password? Ref {case}"
    revenue = f"What was the net revenue of ACME Corp in 2023? Ref {case}"
    other_year = f"What was the net revenue of ACME Corp in 2022? Ref {case}"

    def cosine(a: str, b: str) -> float:
        """What the gateway compares: a chat's normalised last user message."""
        va, vb = minilm.encode([normalise(a), normalise(b)])
        return float(va @ vb) / float(np.linalg.norm(va) * np.linalg.norm(vb))

    # what makes the test mean something: both pairs clear the threshold, so only the guard
    # tells the second pair apart
    assert cosine(stored, paraphrase) >= DEFAULT_SEMANTIC_THRESHOLD
    assert cosine(revenue, other_year) >= DEFAULT_SEMANTIC_THRESHOLD
    assert not guards_pass(revenue, other_year)
    first_source, first = chat(gw, stored)
    assert first_source == "miss" and chat(gw, revenue)[0] == "miss"

    source, answer = chat(gw, paraphrase)
    year_source, _ = chat(gw, other_year)

    assert source == "semantic-memory"
    assert answer.choices[0].message.content == first.choices[0].message.content
    assert year_source == "miss"


def test_semantic_needs_the_same_context_and_a_question_length_prompt(gw: Running) -> None:
    question = unique("How do I reset my online banking password?")
    system = [{"role": "system", "content": "Answer as the retail bank's assistant."}]
    other_system = [{"role": "system", "content": "Answer as the private bank's assistant."}]
    ask = [{"role": "user", "content": question}]
    near = [{"role": "user", "content": question.replace("How do I", "How can I")}]
    client = gw.client()

    def source(messages: list[dict[str, str]]) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=gw.model, messages=messages, temperature=0
        )
        return raw.headers[CACHE_HEADER]

    assert source(system + ask) == "miss"
    assert source(system + near) == "semantic-memory"  # same context, similar question
    assert source(other_system + near) == "miss"  # another system prompt: not the same answer
    # a long instruction with a short distinct tail embeds close to the instruction alone
    head = unique("Our bank's policy on wire transfers, in full detail. " * 6)
    assert complete(gw, head)[0] == "miss"
    assert complete(gw, head + " And for acme?")[0] == "prefix"


# -- failure of the shared tier ------------------------------------------------------------------


def test_a_redis_stopped_mid_test_degrades_the_cache_not_the_requests(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    """Killed by PID: answers cannot be validated without Redis, so they miss (and are not
    stored); KV pages and embeddings still hit from memory; /healthz says degraded, with the
    component and why, within 2 s; no request fails."""
    import os
    import signal
    import time

    server = RedisServer().start()
    running, stop = start(backend, minilm, tmp_path / "data", server.url)
    try:
        stored = unique("What is the minimum balance on a savings account? " * 3)
        assert complete(running, stored)[0] == "miss"
        assert complete(running, stored)[0] == "exact-memory"
        client = running.client()
        client.embeddings.create(model=EMBEDDING_MODEL, input="offline")
        os.kill(server.pid, signal.SIGKILL)
        killed = time.monotonic()
        while httpx.get(f"{running.url}/healthz").json()["status"] != "degraded":
            assert time.monotonic() - killed < 2, "healthz did not say degraded within 2 s"
        health = httpx.get(f"{running.url}/healthz").json()
        assert "generations" in health["degraded"] and "redis" in health["degraded"]["generations"]

        source, answer = complete(running, stored)
        assert source == "prefix" and answer.choices[0].text is not None  # pages still hit
        fresh_source, fresh = complete(running, unique("Who is my account manager?"))
        chat_source, reply = chat(running, unique("Lost card, what now?"))
        embedded = client.embeddings.with_raw_response.create(
            model=EMBEDDING_MODEL, input="offline"
        )
        metrics = httpx.get(f"{running.url}/metrics").text

        assert fresh_source == "miss" and fresh.choices[0].text is not None
        assert chat_source == "miss" and reply.choices[0].message.content is not None
        assert embedded.headers[CACHE_HEADER] == "exact-memory"
        assert len(embedded.parse().data[0].embedding) == 384
        missed = 'preheat_cache_lookups_total{kind="exact",result="unvalidated",tier="generations"}'
        lines = [line for line in metrics.splitlines() if line.startswith(missed)]
        assert lines and float(lines[0].split()[-1]) >= 3  # Redis really was down for them
        assert 'preheat_cache_degraded{component="generations"} 1.0' in metrics
        producer = running.app.state.gateway.producer
        assert producer.flush(10) and producer.stats.spooled >= 3  # the log went to the spool
    finally:
        stop()
        server.stop()


# -- observability ------------------------------------------------------------------------------


def test_metrics_expose_latency_by_outcome_hits_by_tier_and_the_cache_counters(
    gw: Running,
) -> None:
    prompt = unique("What is the overdraft limit on a joint account? " * 3)  # two KV pages
    complete(gw, prompt)
    complete(gw, prompt)
    text = httpx.get(f"{gw.url}/metrics").text

    def value(prefix: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        assert lines, prefix
        return float(lines[0].split()[-1])

    hit = 'preheat_gateway_request_seconds_count{outcome="exact-memory",route="completions"}'
    assert value(hit) >= 1
    assert value('preheat_gateway_request_seconds_count{outcome="miss",route="completions"}') >= 1
    assert value('preheat_gateway_hits_total{kind="exact",tier="memory"}') >= 1
    assert value('preheat_cache_lookups_total{kind="exact",result="hit",tier="memory"}') >= 1
    assert value('preheat_cache_writes_total{kind="prefix",result="stored",tier="redis"}') >= 1


def test_every_request_is_logged_to_the_live_stream(gw: Running) -> None:
    prompt = unique("When is my next card payment due?")
    complete(gw, prompt)
    complete(gw, prompt, key="sk-beta-1")
    gw.client().embeddings.create(model=EMBEDDING_MODEL, input=prompt)
    assert gw.app.state.gateway.producer.flush(10)

    client = redis.Redis.from_url(str(gw.redis_url))
    records = [orjson.loads(fields[b"r"]) for _, fields in client.xrange(gw.stream)]
    client.close()
    mine = [r for r in records if r.get("prompt") == prompt]
    assert sorted((r["tenant"], r["route"]) for r in mine) == [
        ("acme", "completions"), ("acme", "embeddings"), ("beta", "completions"),
    ]  # fmt: skip
    completion = next(r for r in mine if r["route"] == "completions")
    assert completion["prompt_tokens"] > 0 and completion["output_tokens"] > 0
    assert completion["latency_ms"] >= 0 and completion["request_id"]


def test_healthz_and_the_base64_default_of_the_client(gw: Running) -> None:
    assert httpx.get(f"{gw.url}/healthz").json() == {
        "status": "ok", "model": gw.model, "degraded": {}
    }  # fmt: skip
    body = {"model": EMBEDDING_MODEL, "input": "abc", "encoding_format": "base64"}
    reply = httpx.post(
        f"{gw.url}/v1/embeddings", json=body, headers={"Authorization": "Bearer sk-acme-1"}
    ).json()
    vector = np.frombuffer(base64.b64decode(reply["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-3


# -- in front of an upstream OpenAI-compatible server ------------------------------------------


@contextmanager
def in_front_of_upstream(
    backend: Any, minilm: MiniLM, data_dir: Path
) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    """(a client of a gateway in front of the project's OpenAI server as `fin-llm`, a client of
    that server itself, serving the model as `tiny`)."""
    from models.llm.openai_server import create_app as upstream_app
    from models.llm.openai_server import serve_in_thread

    upstream_url, stop_upstream = serve_in_thread(upstream_app(backend, served_name="tiny"))
    config = GatewayConfig(
        keys=KEYS, admin_keys=[ADMIN], backend="openai", base_url=upstream_url,
        upstream_model="tiny", served_model="fin-llm", data_dir=data_dir, ssd_bytes=0,
        templates=False,
    )  # fmt: skip
    url, stop = serve_in_thread(create_app(config, minilm=minilm))  # its own upstream client
    try:
        yield (
            openai.OpenAI(base_url=f"{url}/v1", api_key="sk-acme-1", max_retries=0),
            openai.OpenAI(base_url=f"{upstream_url}/v1", api_key="x", max_retries=0),
        )
    finally:
        stop()
        stop_upstream()


def test_in_front_of_an_upstream_server_answers_are_cached_per_route(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    with in_front_of_upstream(backend, minilm, tmp_path) as (client, direct):
        prompt = unique("What is the cut-off time for same-day payments?")

        def ask() -> tuple[str, str]:
            raw = client.completions.with_raw_response.create(
                model="fin-llm", prompt=prompt, temperature=0
            )
            return raw.headers[CACHE_HEADER], raw.parse().choices[0].text

        def ask_chat() -> tuple[str, str | None]:
            raw = client.chat.completions.with_raw_response.create(
                model="fin-llm", messages=[{"role": "user", "content": prompt}], temperature=0
            )
            return raw.headers[CACHE_HEADER], raw.parse().choices[0].message.content

        truth = direct.completions.create(model="tiny", prompt=prompt, temperature=0)
        first_source, first_text = ask()  # `prefix`: the upstream's own prefix cache reported it
        assert first_source in MODEL_ANSWERED and first_text == truth.choices[0].text
        assert ask() == ("exact-memory", truth.choices[0].text)
        chat_source, chat_text = ask_chat()  # same words, another route: not the same answer
        assert chat_source in MODEL_ANSWERED and ask_chat() == ("exact-memory", chat_text)
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="tiny", prompt=prompt)


def test_an_upstream_stream_is_passed_through_as_it_arrives_and_stored_whole(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    with in_front_of_upstream(backend, minilm, tmp_path) as (client, direct):
        prompt = unique("What does a wire transfer abroad cost?")
        ask = {"prompt": prompt, "temperature": 0, "max_tokens": 24}
        streamed = direct.completions.create(model="tiny", stream=True, **ask)
        truth = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
        assert truth == direct.completions.create(model="tiny", **ask).choices[0].text

        with client.completions.with_streaming_response.create(
            model="fin-llm", stream=True, **ask
        ) as response:
            source = response.headers[CACHE_HEADER]
            pieces = [c.choices[0].text for c in response.parse() if c.choices]
        assert source == "miss"  # the upstream's own prefix cache is told only at the end
        assert len([p for p in pieces if p]) > 1  # (that they pass as they come: the unit tests)
        assert "".join(pieces) == truth
        hit = client.completions.with_raw_response.create(model="fin-llm", **ask)
        assert hit.headers[CACHE_HEADER] == "exact-memory"
        assert hit.parse().choices[0].text == truth

        messages = [{"role": "user", "content": unique("Is there a fee for SEPA payments?")}]
        chunks = client.chat.completions.create(
            model="fin-llm", messages=messages, temperature=0, max_tokens=12, stream=True
        )
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        again = client.chat.completions.with_raw_response.create(
            model="fin-llm", messages=messages, temperature=0, max_tokens=12
        )
        assert again.headers[CACHE_HEADER] == "exact-memory"
        assert again.parse().choices[0].message.content == said


# -- the twelve metrics and the traces -----------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus exposition (labels in any order)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    raise KeyError((name, labels))


def test_every_one_of_the_twelve_metrics_is_exported(gw: Running) -> None:
    from models.serving.metrics import HELP

    complete(gw, unique("What is the overdraft limit?"))
    text = httpx.get(f"{gw.url}/metrics").text
    from prometheus_client.parser import text_string_to_metric_families

    exported = {family.name for family in text_string_to_metric_families(text)}
    assert set(HELP) <= exported, set(HELP) - exported
    assert metric(text, "preheat_gateway_slo_seconds") == 1.0
    assert metric(text, "preheat_gateway_cold_start_seconds", phase="load") > 0
    memory = metric(text, "preheat_gateway_accelerator_memory_bytes", device="cpu",
                    source="process_rss")  # fmt: skip
    assert memory > 10_000_000
    assert metric(text, "preheat_gateway_feature_load_seconds_count", what="minilm") == 1


def test_hits_on_what_a_warm_up_run_stored_are_attributed_to_it_and_priced(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    """A real warm-up batch (ledger and all) into the gateway's cache, then traffic: hits on
    its entries count for warm-up, hits on traffic's own entries do not; the ROI is the
    formula over the exposed value and cost."""
    from models.warmup.execute import WarmItem, WarmLedger, backend_target, execute_batch

    running, stop = start(backend, minilm, tmp_path / "data", None, semantic=False, refresh_s=0)
    try:
        prompt = unique("Summarise the fees of a premium account.")
        prefix = unique("You are the assistant of a retail bank. Answer briefly. " * 3)
        items = [WarmItem(0, "acme", "response:1", "response", None, "memory", prompt),
                 WarmItem(1, "acme", "kv:1", "kv_prefix", None, "memory", prefix)]  # fmt: skip
        ledger = WarmLedger(WarmLedger.path_for(tmp_path / "data", "plan"), backend_target(backend))
        ledger.register(items)  # (what `open_job` does before the batches run)
        stats = execute_batch(items, backend, running.cache, ledger)
        spent = float(ledger.frame()["seconds"].sum())
        ledger.close()
        assert stats.done == 2
        running.app.state.gateway.signals.refresh()

        fresh = unique("Who can open a junior account?")
        sources = [complete(running, p)[0] for p in (prompt, prefix + " Overdraft?", fresh, fresh)]
        text = httpx.get(f"{running.url}/metrics").text
    finally:
        stop()
    assert sources == ["exact-memory", "prefix", "miss", "exact-memory"]

    def hits(kind: str, writer: str) -> float:
        return metric(text, "preheat_gateway_attributed_hits_total", kind=kind, writer=writer)

    assert hits("exact", "warmup") == 1 and hits("prefix", "warmup") == 1
    assert hits("exact", "traffic") == 1
    assert metric(text, "preheat_gateway_warmup_hit_share") == pytest.approx(2 / 3)
    value = metric(text, "preheat_gateway_warmup_value")
    cost = metric(text, "preheat_gateway_warmup_cost")
    assert cost == pytest.approx(spent, rel=1e-3)  # the ledger's compute seconds (x 1.0)
    assert value > 0
    assert metric(text, "preheat_gateway_warmup_roi") == pytest.approx((value - cost) / cost)
    # two model calls (the prefix hit and the miss), one warmed exact hit
    assert metric(text, "preheat_gateway_warmup_qps_gain") == pytest.approx(1 / 2)


def test_the_canary_group_is_served_without_the_cache_and_its_share_is_observed(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    import random

    running, stop = start(
        backend, minilm, tmp_path / "data", None, inject={"rng": random.Random(5)},
        semantic=False, refresh_s=0, canary_share=0.5,
    )  # fmt: skip
    try:
        prompt = unique("What is the interest on a savings account?")
        running.cache.put(ExactKey.of("acme", running.model, prompt), MARKER.encode())
        answers = [complete(running, prompt) for _ in range(16)]
        opted_out = complete(running, prompt, extra_body={"cache": False})[0]
        text = httpx.get(f"{running.url}/metrics").text
    finally:
        stop()
    canary = [a for source, a in answers if source == "canary"]
    cached = [a for source, a in answers if source != "canary"]
    assert 0 < len(canary) < 16 and opted_out == "bypass"  # an opt-out is not in the control
    assert all(a.choices[0].text != MARKER for a in canary)  # the cache was off for them
    assert all(a.choices[0].text == MARKER for a in cached)
    assert metric(text, "preheat_gateway_canary_share") == pytest.approx(len(canary) / 16)
    assert metric(text, "preheat_gateway_canary_requests_total", group="canary") == len(canary)


def test_requests_cache_lookups_and_model_calls_are_spans_and_off_means_none(
    gw: Running, backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cache_runtime.telemetry import TracingSettings, build_provider
    from models.serving.metrics import tenant_label

    assert isinstance(gw.app.state.gateway.tracer, trace.NoOpTracer)  # the default: off
    exporter = InMemorySpanExporter()
    provider = build_provider(TracingSettings(), exporter)
    inject = {"tracer_provider": provider}
    running, stop = start(
        backend, minilm, tmp_path / "data", None, inject, semantic=False, refresh_s=0
    )
    try:
        prompt = unique("How do I report a stolen card?")
        complete(running, prompt)
        complete(running, prompt)
        with pytest.raises(openai.AuthenticationError):
            complete(running, prompt, key="sk-nobody")
    finally:
        stop()
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "gateway.request"]
    outcomes = [(s.attributes or {}).get("preheat.outcome") for s in requests]
    assert outcomes == ["miss", "exact-memory", "error_401"]
    first = dict(requests[0].attributes or {})
    assert first["preheat.route"] == "completions" and first["http.response.status_code"] == 200
    assert first["preheat.tenant"] == tenant_label("acme", "hashed") != "acme"
    children = [s for s in spans if s.parent is not None]
    assert {s.name for s in children} == {"cache.lookup", "model.generate"}
    request_ids = {s.context.span_id for s in requests}
    assert all(s.parent.span_id in request_ids for s in children)  # type: ignore[union-attr]
    lookups = [dict(s.attributes or {}) for s in children if s.name == "cache.lookup"]
    assert [(a["preheat.cache.kind"], a["preheat.cache.tier"]) for a in lookups] == [
        ("exact", "none"), ("exact", "memory"),
    ]  # fmt: skip
    provider.shutdown()


def test_a_failing_metric_never_fails_the_request(
    gw: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = gw.app.state.gateway.signals

    def broken(*args: Any) -> None:
        raise RuntimeError("a metric bug")

    monkeypatch.setattr(signals, "generation", broken)
    monkeypatch.setattr(signals, "embeddings", broken)
    before = signals.metrics.value("preheat_gateway_degraded_total", component="metrics")
    source, answer = complete(gw, unique("Can I pay my bill online?"))
    embedded = gw.client().embeddings.create(model=EMBEDDING_MODEL, input=unique("bill"))

    assert source == "miss" and answer.choices[0].text is not None
    assert len(embedded.data[0].embedding) == 384
    after = signals.metrics.value("preheat_gateway_degraded_total", component="metrics")
    assert after == before + 2


# -- limits ---------------------------------------------------------------------------------------


def test_oversized_requests_are_refused_before_any_work_with_the_parameter_named(
    gw: Running,
) -> None:
    headers = {"Authorization": "Bearer sk-acme-1", "content-type": "application/json"}
    huge = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * (2 << 20) + b'"}]}'
    reply = httpx.post(f"{gw.url}/v1/chat/completions", content=huge, headers=headers)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused as the bytes pass the limit
        yield huge[: 1 << 20]
        yield huge[1 << 20 :]

    streamed = httpx.post(f"{gw.url}/v1/chat/completions", content=chunks(), headers=headers)
    assert streamed.status_code == 413

    client = gw.client()
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(
            model=gw.model, messages=[{"role": "user", "content": "hi"}], max_tokens=10**6,
            temperature=0,
        )  # fmt: skip
    assert too_many.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as inputs:
        client.embeddings.create(model=EMBEDDING_MODEL, input=["a"] * 300)
    assert inputs.value.body["param"] == "input"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="word pieces"):
        client.embeddings.create(model=EMBEDDING_MODEL, input="word " * 400)


def test_a_tenant_over_its_slots_gets_429_with_retry_after_and_others_are_served(
    backend: Any, minilm: MiniLM, tmp_path: Path, redis_url: str
) -> None:
    import threading

    running, stop = start(
        backend, minilm, tmp_path / "data", redis_url, tenant_concurrency=1, tenant_queue=0,
        retry_after_s=3,
    )  # fmt: skip
    try:
        long = {"model": running.model, "prompt": unique("A long answer, please."),
                "max_tokens": 300, "temperature": 0.7, "stream": True}  # fmt: skip
        headers = {"Authorization": "Bearer sk-acme-1"}
        started = threading.Event()

        def occupy() -> None:
            with httpx.stream("POST", f"{running.url}/v1/completions", json=long,
                              headers=headers, timeout=60) as reply:  # fmt: skip
                for _ in reply.iter_lines():
                    started.set()

        holder = threading.Thread(target=occupy)
        holder.start()
        assert started.wait(30)  # acme's one slot is taken, its queue has no room
        refused = httpx.post(f"{running.url}/v1/completions", headers=headers, timeout=30,
                             json={**long, "stream": False, "max_tokens": 4})  # fmt: skip
        other = complete(running, unique("And for beta?"), key="sk-beta-1", max_tokens=4)
        holder.join(60)

        assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert other[0] in MODEL_ANSWERED  # another tenant is not limited by acme's flood
        assert complete(running, unique("Now it is free."), max_tokens=4)[0] in MODEL_ANSWERED
    finally:
        stop()

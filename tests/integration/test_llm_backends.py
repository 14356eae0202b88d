"""Warm-up backends against real things: the tiny GPT-2 saved to disk, a HybridCache over memory
and a real Redis, a temp sqlite MLflow store, and the OpenAI-compatible server on a free port."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import FakeClock

from cache_runtime.hybrid import HybridCache
from cache_runtime.kv_pages import PAGE_TOKENS, load_prefix, page_keys
from cache_runtime.sessions import TenantSessionPages
from cache_runtime.tiers import MemoryTier, RedisTier, redis_client
from models.llm.backends import (
    BackendError,
    HFBackend,
    OpenAICompatibleBackend,
    WarmupBackend,
    model_fingerprint,
)

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

SYSTEM = (
    "You are the acme assistant. Follow the bank's compliance policy, cite the relevant "
    "document and answer in two sentences at most. "
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    return save_tiny_llm(tmp_path_factory.mktemp("llm") / "tiny-gpt2")


@pytest.fixture(scope="module")
def backend(tiny_dir: Path) -> Iterator[HFBackend]:
    backend = HFBackend.from_path(tiny_dir, device="cpu")  # the tests feed it CPU tensors
    yield backend
    backend.close()


@pytest.fixture
def memory_cache() -> Iterator[HybridCache]:
    cache = HybridCache([MemoryTier(64 << 20)])
    yield cache
    cache.close()


def prompt_of(backend: HFBackend, tokens: int, topic: str) -> str:
    """A prompt of about `tokens` tokens, its first page already particular to `topic` (so
    prompts of different topics share no page), never a whole number of pages: a partial last
    page is the common case, and the tests want one."""
    ids = backend.encode(f"On {topic}: " + SYSTEM * 6)
    prompt = backend.tokenizer.decode(ids[: tokens - 4]) + " Thanks."
    while len(backend.encode(prompt)) % PAGE_TOKENS == 0:
        prompt += " Thanks."
    return prompt


def test_warm_stores_full_pages_that_continue_like_a_full_prefill(
    backend: HFBackend, redis_url: str
) -> None:
    client = redis_client(redis_url)
    cache = HybridCache([MemoryTier(64 << 20), RedisTier(client, namespace="llm-test")])
    prompt = prompt_of(backend, 100, "fees")
    tokens = backend.encode(prompt)
    assert isinstance(backend, WarmupBackend) and len(tokens) % PAGE_TOKENS and len(tokens) > 90

    result = backend.warm_prefix("acme", prompt, cache)

    assert result.tokens == len(tokens) and result.pages_stored == len(tokens) // PAGE_TOKENS
    assert result.cached_tokens == 0 and result.response is None and result.backend == "hf"
    redis_only = HybridCache([RedisTier(client, namespace="llm-test")])
    restored, cached = load_prefix(
        redis_only, "acme", backend.model_id, tokens, backend.model.config
    )
    assert cached == result.pages_stored * PAGE_TOKENS  # every page reached Redis
    with torch.no_grad():
        full = backend.model(torch.tensor([tokens])).logits[:, -1]
        rest = backend.model(torch.tensor([tokens[cached:]]), cache=restored).logits[:, -1]
    torch.testing.assert_close(rest, full, rtol=0, atol=1e-4)
    redis_only.close()
    cache.close()


def test_a_second_warm_stores_nothing_and_runs_no_model(
    backend: HFBackend, memory_cache: HybridCache
) -> None:
    prompt = prompt_of(backend, 100, "loans")
    pages = len(backend.encode(prompt)) // PAGE_TOKENS
    first = backend.warm_prefix("acme", prompt, memory_cache)
    calls: list[int] = []
    hook = backend.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        second = backend.warm_prefix("acme", prompt, memory_cache)
    finally:
        hook.remove()
    assert pages == 6 and first.pages_stored == pages and second.pages_stored == 0
    assert second.cached_tokens == pages * PAGE_TOKENS and calls == []


def test_an_extended_prompt_prefills_only_its_new_pages_and_they_are_right(
    backend: HFBackend, memory_cache: HybridCache
) -> None:
    """Pages computed on top of restored ones must equal those of a cold full prefill."""
    short = prompt_of(backend, 50, "cards")
    longer = short + " " + prompt_of(backend, 60, "mortgages")
    tokens, short_pages = backend.encode(longer), len(backend.encode(short)) // PAGE_TOKENS
    assert tokens[: short_pages * PAGE_TOKENS] == backend.encode(short)[: short_pages * PAGE_TOKENS]
    assert backend.warm_prefix("acme", short, memory_cache).pages_stored == short_pages >= 2
    result = backend.warm_prefix("acme", longer, memory_cache)
    assert result.cached_tokens == short_pages * PAGE_TOKENS
    assert result.pages_stored == len(tokens) // PAGE_TOKENS - short_pages > 0
    restored, cached = load_prefix(memory_cache, "acme", backend.model_id, tokens, None)
    assert cached == len(tokens) // PAGE_TOKENS * PAGE_TOKENS
    with torch.no_grad():
        full = backend.model(torch.tensor([tokens]), use_cache=True).cache
    for page_layer, full_layer in zip(restored.layers, full.layers, strict=True):
        torch.testing.assert_close(
            page_layer.keys, full_layer.keys[:, :, :cached], atol=1e-4, rtol=0
        )
        torch.testing.assert_close(
            page_layer.values, full_layer.values[:, :, :cached], atol=1e-4, rtol=0
        )


def test_store_response_is_served_by_exact_key_for_that_tenant_only(
    backend: HFBackend, memory_cache: HybridCache
) -> None:
    prompt = prompt_of(backend, 40, "savings")
    result = backend.warm_prefix("acme", prompt, memory_cache, store_response=True)
    assert result.response  # random weights: some text, meaningless
    assert memory_cache.get_exact("acme", backend.model_id, prompt) == result.response.encode()
    assert memory_cache.get_exact("globex", backend.model_id, prompt) is None
    # Greedy: warming again gives the same response, now from the cached prefix.
    again = backend.warm_prefix("acme", prompt, memory_cache, store_response=True)
    assert again.response == result.response and again.cached_tokens > 0


def test_a_conversation_idle_past_the_timeout_is_ended_at_the_next_request(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's idle end: a served request first ends the conversations idle for the
    timeout (their own pages cooled in the memory tier); one that resumes is a follow-up."""
    clock = FakeClock()
    sessions = TenantSessionPages(idle_end_s=300.0, clock=clock)
    cache = HybridCache([MemoryTier(64 << 20)], sessions=sessions)
    cooled: list[list[str]] = []
    memory = cache.tiers[0]
    real_cool = memory.cool
    monkeypatch.setattr(memory, "cool", lambda keys: cooled.append(list(keys)) or real_cool(keys))
    prompts = {name: prompt_of(backend, 3 * PAGE_TOKENS + 5, name) for name in ("a", "b", "c")}
    pages = {
        name: [
            key.to_string() for key in page_keys("acme", backend.model_id, backend.encode(p))[:3]
        ]
        for name, p in prompts.items()
    }
    try:
        backend.complete(prompts["a"], 1, cache=cache, tenant="acme", session="chat-a")
        clock.now += 299.0
        backend.complete(prompts["b"], 1, cache=cache, tenant="acme", session="chat-b")
        assert cooled == []  # chat-a was idle 299 s
        clock.now += 1.0
        backend.complete(prompts["c"], 1, cache=cache, tenant="acme")  # no session
        assert cooled == [pages["a"]]
        assert sessions.live("acme", "chat-a")  # resuming, it is a follow-up turn
        clock.now += 300.0
        backend.complete(
            prompts["a"] + " And more?", 1, cache=cache, tenant="acme", session="chat-a"
        )
        assert cooled[1] == pages["b"]  # chat-b's end came first; chat-a read again just now
    finally:
        cache.close()


def test_model_id_follows_the_weights_not_the_path(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(tiny_dir, tmp_path / "copy")
    assert model_fingerprint(copy) == model_fingerprint(tiny_dir)
    weights = load_file(copy / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    assert model_fingerprint(copy) != model_fingerprint(tiny_dir)


def test_registered_model_loads_by_alias_and_warms(
    backend: HFBackend, tiny_dir: Path, tmp_path: Path, memory_cache: HybridCache
) -> None:
    import mlflow.pyfunc
    import pandas as pd

    from models.llm.registry import register_llm

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert register_llm(tiny_dir, uri, tmp_path / "artifacts") == "1"
    assert register_llm(tiny_dir, uri, tmp_path / "artifacts") == "2"
    client = mlflow.MlflowClient(uri)
    assert str(client.get_model_version_by_alias("preheat-llm", "champion").version) == "1"

    loaded = HFBackend.from_registry(uri)
    try:
        assert loaded.model_id == backend.model_id  # same weights: pages are shared
        assert "version 1" in loaded.source
        assert loaded.device == ("cuda" if torch.cuda.is_available() else "cpu")
        prompt = prompt_of(loaded, 100, "registry")
        assert loaded.warm_prefix("acme", prompt, memory_cache).pages_stored == 6
        assert backend.warm_prefix("acme", prompt, memory_cache).pages_stored == 0
    finally:
        loaded.close()
    pyfunc = mlflow.pyfunc.load_model("models:/preheat-llm@champion")
    out = pyfunc.predict(pd.DataFrame({"prompt": ["a b c"]}), params={"max_tokens": 3})
    assert list(out.columns) == ["text"] and len(out) == 1
    with pytest.raises(LookupError, match="no preheat-llm@staging"):
        HFBackend.from_registry(uri, alias="staging")


# -- the OpenAI-compatible server and the remote backend ------------------------------------------


@pytest.fixture(scope="module")
def server(backend: HFBackend) -> Iterator[str]:
    from models.llm.openai_server import create_app, serve_in_thread

    base_url, stop = serve_in_thread(create_app(backend, served_name="tiny"))
    yield base_url
    stop()


def completion(base_url: str, prompt: str | list[str], **extra: object) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=30)


def test_warming_the_server_makes_the_next_request_hit_its_prefix_cache(
    server: str, backend: HFBackend
) -> None:
    prefix = prompt_of(backend, 90, "remote warm-up")
    cold = completion(server, prompt_of(backend, 90, "a cold control") + " Hi?").json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    before = httpx.get(f"{server}/stats").json()
    remote = OpenAICompatibleBackend(server + "/v1", "tiny")
    try:
        warm = remote.warm_prefix("acme", prefix, None)
    finally:
        remote.close()
    assert warm.pages_stored == 0 and warm.cached_tokens == 0 and warm.response is None
    reply = completion(server, prefix + " What is the fee for a late payment?").json()
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == warm.tokens // PAGE_TOKENS * PAGE_TOKENS > 0
    after = httpx.get(f"{server}/stats").json()
    assert after["cached_tokens"] - before["cached_tokens"] == cached
    assert after["requests"] - before["requests"] == 2


def test_remote_store_response_goes_under_the_served_model_name(
    server: str, backend: HFBackend, memory_cache: HybridCache
) -> None:
    remote = OpenAICompatibleBackend(server, "tiny", response_tokens=4)
    prompt = prompt_of(backend, 30, "remote response")
    try:
        result = remote.warm_prefix("acme", prompt, memory_cache, store_response=True)
    finally:
        remote.close()
    assert result.response is not None
    assert memory_cache.get_exact("acme", "tiny", prompt) == result.response.encode()


def test_remote_failures_are_one_line_backend_errors(server: str) -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/completions") and b"timeout" in request.content:
            raise httpx.ReadTimeout("read timed out", request=request)
        return httpx.Response(500, text="<html>\n<body>Internal\nServer Error</body>\n</html>")

    unknown = OpenAICompatibleBackend(server, "no-such-model")
    mocked = OpenAICompatibleBackend(
        "http://gpu-0:8000", "m", transport=httpx.MockTransport(failing)
    )
    closed = OpenAICompatibleBackend("http://127.0.0.1:1", "m", timeout_s=2)
    cases = [
        (unknown, "x", "HTTP 404: The model `no-such-model` does not exist."),
        (mocked, "timeout please", "timed out"),
        (mocked, "x", "HTTP 500: <html> <body>Internal Server Error</body> </html>"),
        (closed, "x", "POST http://127.0.0.1:1/v1/completions:"),
    ]
    for remote, prompt, expected in cases:
        with pytest.raises(BackendError) as caught:
            remote.warm_prefix("acme", prompt, None)
        assert expected in str(caught.value) and "\n" not in str(caught.value)
    for remote in (unknown, mocked, closed):
        remote.close()


def test_chat_models_and_errors_have_the_openai_shapes(server: str) -> None:
    chat = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3},
        timeout=30,
    )
    body = chat.json()
    assert chat.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= body["usage"]["completion_tokens"] <= 3  # fewer when it stops at end of text
    models = httpx.get(f"{server}/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["object"] == "model"

    several = completion(server, ["one two", "three four"]).json()
    assert several["object"] == "text_completion" and len(several["choices"]) == 2
    assert several["usage"]["total_tokens"] == sum(
        several["usage"][k] for k in ("prompt_tokens", "completion_tokens")
    )
    for response, status in [
        (completion(server, ["one", "two"], stream=True), 400),  # a stream takes one prompt
        (completion(server, "x " * 600, stream=True), 400),  # refused before the stream starts
        (completion(server, "x", max_tokens=0), 400),
        (completion(server, "x " * 600), 400),  # beyond the 512-token context
        (completion(server, "x", model="other"), 404),
    ]:
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}

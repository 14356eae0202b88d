"""The gateway's HTTP surface as the `openai` client meets it: every route, every error in
OpenAI's shape (a string `code`, the request's own parameter name), roles, types and usage."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from test_gateway import (  # the gateway tests' fixtures (a model and MiniLM per module)
    EMBEDDING_MODEL,
    Running,
    backend,  # noqa: F401
    minilm,  # noqa: F401
    start,
    unique,
)

from models.serving.embeddings import MiniLM

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gw(
    backend: Any,  # noqa: F811
    minilm: MiniLM,  # noqa: F811
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    running, stop = start(backend, minilm, tmp_path_factory.mktemp("conform"), redis_url)
    yield running
    stop()


def error_of(reply: httpx.Response) -> dict[str, Any]:
    body = reply.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] is None or isinstance(error["code"], str)
    assert isinstance(error["message"], str) and not error["message"].startswith(":")
    return error


def post(gw: Running, path: str, body: Any, key: str = "sk-acme-1") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if isinstance(body, bytes):
        return httpx.post(f"{gw.url}{path}", content=body, headers=headers, timeout=30)
    return httpx.post(f"{gw.url}{path}", json=body, headers=headers, timeout=30)


def test_routes_and_models_with_the_client(gw: Running) -> None:
    client = gw.client()
    listed = [m.id for m in client.models.list().data]
    assert gw.model in listed and EMBEDDING_MODEL in listed
    assert client.models.retrieve(gw.model).id == gw.model
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError) as unknown:
        gw.client("sk-wrong").models.list()
    assert unknown.value.body["code"] == "invalid_api_key"  # type: ignore[index]


def test_unknown_routes_and_methods_answer_in_openai_shape(gw: Running) -> None:
    missing = httpx.get(f"{gw.url}/v1/nothing-here")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    wrong = httpx.get(f"{gw.url}/v1/chat/completions")
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ({"messages": [{"role": "user", "content": None}]}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, "max_tokens"),
        ({"messages": []}, "messages"),
    ],
)
def test_bad_chat_requests_name_the_parameter(
    gw: Running, body: dict[str, Any], param: str
) -> None:
    reply = post(gw, "/v1/chat/completions", {"model": gw.model, **body})
    assert reply.status_code == 400
    error = error_of(reply)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "." not in str(error["param"])  # never pydantic's internal path


def test_a_body_that_is_not_json_says_so(gw: Running) -> None:
    reply = post(gw, "/v1/chat/completions", b"{not json")
    assert reply.status_code == 400 and error_of(reply)["message"].startswith("the body is not")


def test_embeddings_honour_dimensions_token_arrays_and_their_limits(gw: Running) -> None:
    client = gw.client()
    same = client.embeddings.create(model=EMBEDDING_MODEL, input="hello", dimensions=384)
    assert len(same.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as shorter:
        client.embeddings.create(model=EMBEDDING_MODEL, input="hello", dimensions=128)
    assert shorter.value.body["param"] == "dimensions"  # type: ignore[index]
    ids = gw.app.state.gateway.embeddings.encode.__self__.model().tokenizer(
        "hello world", add_special_tokens=False
    )["input_ids"]
    by_tokens = client.embeddings.create(model=EMBEDDING_MODEL, input=[ids])
    by_text = client.embeddings.create(model=EMBEDDING_MODEL, input="hello world")
    assert by_tokens.data[0].embedding == pytest.approx(by_text.data[0].embedding, abs=1e-5)
    with pytest.raises(openai.BadRequestError, match="word pieces"):
        client.embeddings.create(model=EMBEDDING_MODEL, input="word " * 300)


def test_usage_counts_the_tokens_returned_after_a_stop_sequence(gw: Running) -> None:
    client = gw.client()
    prompt = unique("Name three kinds of savings accounts.")
    whole = client.completions.create(model=gw.model, prompt=prompt, temperature=0, max_tokens=30)
    text = whole.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.completions.create(
        model=gw.model, prompt=prompt, temperature=0, max_tokens=30, stop=[stop]
    )
    returned = cut.choices[0].text
    assert returned == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    runner = gw.app.state.gateway.chain.runner
    assert cut.usage.completion_tokens == len(runner.tokens(returned))
    assert cut.usage.completion_tokens < whole.usage.completion_tokens

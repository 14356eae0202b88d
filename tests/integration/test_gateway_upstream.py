"""The gateway end to end in front of an upstream OpenAI-compatible server (the project's own,
serving the tiny model): answers cached per route, an upstream stream passed through as it
arrives and stored whole. (The setting: test_gateway.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from gateway_support import ADMIN, KEYS, MODEL_ANSWERED, unique

from flows.gateway import CACHE_HEADER, GatewayConfig, create_app
from models.serving.embeddings import MiniLM

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


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

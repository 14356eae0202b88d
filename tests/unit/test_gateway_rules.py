"""The gateway's rules without a server: API keys, the cache-validity rule, stop sequences,
chat context, and SSE pieces."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache_runtime.serving.auth import KeyFileError, KeyRing, bearer
from cache_runtime.serving.schemas import ChatRequest, CompletionRequest, GatewayError, Message
from flows.gateway.openai_format import pieces
from models.serving.runners import apply_stop, chat_parts
from models.serving.validity import (
    Decoding,
    check_in_process,
    decoding_of,
    response_model_id,
)

# -- keys ----------------------------------------------------------------------------------------


def test_a_key_identifies_its_tenant_and_nothing_else_does() -> None:
    ring = KeyRing({"sk-a": "acme", "sk-b": "beta"}, ["sk-admin"])
    assert ring.identify("sk-a").tenant == "acme" and not ring.identify("sk-a").admin
    assert ring.identify("sk-admin").admin and ring.identify("sk-admin").tenant is None
    for wrong in ("sk-a ", "sk-", "SK-A", "sk-ab", "", None):
        assert ring.identify(wrong) is None


def test_key_files_in_json_and_toml_merge_with_the_environment(tmp_path: Path) -> None:
    json_file = tmp_path / "keys.json"
    json_file.write_text(orjson.dumps({"keys": {"sk-a": "acme"}, "admin_keys": ["sk-x"]}).decode())
    toml_file = tmp_path / "keys.toml"
    toml_file.write_text('admin_keys = ["sk-x"]\n[keys]\n"sk-a" = "acme"\n')
    for path in (json_file, toml_file):
        ring = KeyRing.load(path, {"sk-b": "beta"})
        assert ring.tenants == {"acme", "beta"} and ring.identify("sk-x").admin


@pytest.mark.parametrize(
    ("content", "keys", "message"),
    [
        (None, {}, "no API keys"),
        ('{"keys": {"sk-a": "acme"}}', {"sk-a": "beta"}, "two tenants"),
        ('{"keys": ["sk-a"]}', {}, "must map API keys"),
        ('{"tenants": {}}', {}, "expected only"),
        ("{not json", {}, "not valid JSON/TOML"),
        ('{"keys": {"sk-a": ""}}', {}, "tenant of 1 to 64"),
        ('{"keys": {"sk-a": "acme"}, "admin_keys": ["sk-a"]}', {}, "both a tenant key"),
    ],
)
def test_bad_key_material_is_refused_with_the_reason(
    tmp_path: Path, content: str | None, keys: dict[str, str], message: str
) -> None:
    path = None
    if content is not None:
        path = tmp_path / "keys.json"
        path.write_text(content)
    with pytest.raises(KeyFileError, match=message):
        KeyRing.load(path, keys)


def test_bearer_header_parsing() -> None:
    assert bearer("Bearer sk-a") == "sk-a" and bearer("bearer  sk-a ") == "sk-a"
    assert bearer("Basic sk-a") is None and bearer("Bearer ") is None and bearer(None) is None


# -- the cache-validity rule --------------------------------------------------------------------


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "p", **fields})


def key_model(upstream: bool = False, route: str = "completions", **fields: object) -> str:
    return response_model_id("m", decoding_of(completion(**fields), 16), route, upstream)


def test_the_default_greedy_request_reads_what_warm_up_writes() -> None:
    assert key_model(temperature=0) == "m" == key_model(temperature=0, max_tokens=16)
    assert decoding_of(completion(temperature=0), 16).cacheable
    assert not decoding_of(completion(), 16).cacheable  # OpenAI's default temperature is 1


def test_every_output_shaping_parameter_changes_the_key() -> None:
    base = key_model()
    variants = {
        key_model(max_tokens=17), key_model(stop=["."]), key_model(stop="."),
        key_model(upstream=True, route="chat"), key_model(upstream=True, top_p=0.5),
        key_model(upstream=True, seed=3), key_model(upstream=True, logit_bias={"1": 2}),
    }  # fmt: skip
    assert base not in variants and len(variants) == 6  # stop "." and ["."] are one variant
    # in process, the chat route renders to the prompt: the same input, the same answer
    assert key_model(route="chat") == base and key_model(seed=3) == base


def test_the_in_process_model_refuses_what_it_cannot_honour() -> None:
    check_in_process(decoding_of(completion(presence_penalty=0, logprobs=None), 16))
    with pytest.raises(GatewayError, match="logit_bias"):
        check_in_process(decoding_of(completion(logit_bias={"1": 5}), 16))
    with pytest.raises(GatewayError, match="top_p"):
        check_in_process(decoding_of(completion(temperature=0.7, top_p=0.9), 16))
    with pytest.raises(GatewayError, match="n > 1"):
        decoding_of(completion(n=2), 16)


def test_chat_max_completion_tokens_wins() -> None:
    request = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 5,
         "max_completion_tokens": 7}
    )  # fmt: skip
    assert decoding_of(request, 16) == Decoding(7, 1.0)


# -- pieces of the chain ------------------------------------------------------------------------


def test_stop_sequences_cut_before_the_first_match() -> None:
    assert apply_stop("a. b! c", (" c", "!"), "length") == ("a. b", "stop")
    assert apply_stop("abc", ("x",), "length") == ("abc", "length")


def test_chat_context_is_exact_and_the_question_is_the_last_user_turn() -> None:
    def msgs(*pairs: tuple[str, str]) -> list[Message]:
        return [Message(role=r, content=c) for r, c in pairs]

    question, none = chat_parts(msgs(("user", "q")))
    assert (question, none) == ("q", "")
    _, retail = chat_parts(msgs(("system", "retail"), ("user", "q")))
    _, private = chat_parts(msgs(("system", "private"), ("user", "q")))
    assert retail and private and retail != private
    assert chat_parts(msgs(("user", "q"), ("assistant", "a")))[0] is None


@given(st.text(alphabet=st.sampled_from(list("ab \n\t.é")), max_size=40))
def test_stream_pieces_join_back_to_the_text(text: str) -> None:
    assert "".join(pieces(text)) == text

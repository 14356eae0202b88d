"""The model behind the gateway: a Hugging Face LM in this process, or an upstream server.

- `InProcessRunner` calls `HFBackend.complete` with the node cache and the tenant, so a request
  reuses the KV pages of its longest cached prefix (its own or warm-up's: the same `PrefixKey`
  chain, rooted per tenant and model) and prefills only the rest, and its new full pages are
  stored for the next one. Chat messages are rendered to the prompt the model reads
  (`openai_server.chat_prompt`), which is also the prompt the response is keyed by.
- `UpstreamRunner` sends the request on to an OpenAI-compatible server (vLLM, SGLang), whose own
  prefix cache holds the KV. Chat requests are keyed by their messages as canonical JSON (the
  server applies a chat template the gateway does not know: two message lists that render
  alike here may not there).

Both stream: `generate(..., listener=...)` hears each token's text as it is decoded
(`streaming.py`), stop sequences applied as it goes. The in-process model's decoding loop calls
it; an upstream's SSE stream is read as it arrives and passed on (`UpstreamRunner._stream`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import orjson

from cache_runtime.prefix_hash import chain_block_hashes, token_blocks
from cache_runtime.serving.schemas import GatewayError, Message, bad_request
from models.serving.streaming import GenerationCancelled, StopScanner
from models.serving.validity import Decoding, check_in_process

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from models.llm.backends import DecodeListener, HFBackend


@dataclass(frozen=True)
class Job:
    """One request as the model sees it.

    Attributes:
        route: "completions" or "chat".
        key_text: what the exact key hashes (the rendered prompt, or canonical chat JSON).
        text: the prompt as text (logged to the stream, assigned a template).
        messages: the chat messages as sent (forwarded to an upstream server).
        question: what a semantic lookup embeds: the prompt, or a chat's last user message
            (None: no semantic lookup, e.g. a chat ending in an assistant turn).
        context: digest of everything else a chat's answer depends on (system prompt, earlier
            turns): a semantic hit needs it equal, not similar ("" for a plain prompt).
        session: the client's conversation id: the KV pages the request reads count as read
            by it, so that ending the session cools them (never part of a cache key).
    """

    route: str
    key_text: str
    text: str
    decoding: Decoding
    messages: list[dict[str, Any]] | None = None
    question: str | None = None
    context: str = ""
    session: str | None = None  # the client's conversation id (`x-preheat-session`), if any


def chat_parts(messages: list[Message]) -> tuple[str | None, str]:
    """(the last user message, a digest of the turns before it).

    Rejected: embedding the whole conversation. A long system prompt dominates the embedding,
    so two different questions under it score near 1 (and MiniLM reads only its first 256
    word pieces): the question is what may vary, everything before it must match exactly.
    """
    last = messages[-1]
    if last.role != "user":
        return None, ""
    if len(messages) == 1:
        return last.text(), ""
    before = [(m.role, m.text()) for m in messages[:-1]]
    return last.text(), hashlib.blake2b(orjson.dumps(before), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Generation:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from a cache


class Runner(Protocol):
    """What the chain needs from a model: a `Job` from a request, an answer, its tokens."""

    name: str
    model_id: str  # what cache keys are made of
    upstream: bool

    def job(
        self, route: str, prompt: str | None, messages: list[Message] | None, decoding: Decoding
    ) -> Job: ...

    def generate(
        self,
        job: Job,
        cache: HybridCache | None,
        tenant: str,
        listener: DecodeListener | None = None,
    ) -> Generation:
        """The answer; `listener`, if given and the runner streams, hears it as it is decoded."""
        ...

    def tokens(self, text: str) -> list[int] | None: ...

    def close(self) -> None: ...


def plain_chat(messages: list[Message]) -> str:
    """`role: content` lines and an open assistant turn: the prompt of a model without a chat
    template (`openai_server.chat_prompt`'s fallback)."""
    return "".join(f"{m.role}: {m.text()}\n" for m in messages) + "assistant:"


def apply_stop(text: str, stop: tuple[str, ...], finish: str) -> tuple[str, str]:
    """The text up to the first stop sequence (which is not included), as OpenAI returns it."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], "stop") if cuts else (text, finish)


def prefix_hashes(tokens: list[int] | None) -> list[int] | None:
    """The request log's `prefix_hashes` (chained from the global root, as every log source)."""
    if not tokens:
        return None
    return chain_block_hashes(token_blocks(tokens)) or None


class InProcessRunner:
    """`HFBackend` in this process: one forward pass at a time, tenants taking turns."""

    name = "hf"
    upstream = False

    def __init__(self, backend: HFBackend) -> None:
        self.backend = backend
        self.model_id = backend.model_id

    def job(
        self, route: str, prompt: str | None, messages: list[Message] | None, decoding: Decoding
    ) -> Job:
        check_in_process(decoding)
        if messages is not None:
            from models.llm.openai_server import ChatMessage, chat_prompt

            turns = [ChatMessage(role=m.role, content=m.text()) for m in messages]
            question, context = chat_parts(messages)
            rendered = chat_prompt(self.backend.tokenizer, turns)
            return self._fits(Job(route, rendered, rendered, decoding, None, question, context))
        assert prompt is not None
        return self._fits(Job(route, prompt, prompt, decoding, None, prompt))

    def _fits(self, job: Job) -> Job:
        """`job`, if its prompt and `max_tokens` fit the context; else a 400 naming what to
        change, before any model work (and before the request takes one of its tenant's slots)."""
        context, wanted = self.backend.context_tokens, job.decoding.max_tokens
        if wanted >= context:
            raise bad_request(
                f"max_tokens {wanted} does not fit the context of {context} tokens", "max_tokens"
            )
        tokens = len(self.backend.encode(job.key_text))
        if not tokens or tokens + wanted > context:
            param = "messages" if job.route == "chat" else "prompt"
            raise bad_request(
                f"the prompt's {tokens} tokens plus max_tokens {wanted} do not fit the context of "
                f"{context} tokens (and a prompt must not be empty)", param,
            )  # fmt: skip
        return job

    def generate(
        self,
        job: Job,
        cache: HybridCache | None,
        tenant: str,
        listener: DecodeListener | None = None,
    ) -> Generation:
        d = job.decoding
        scanner = StopScanner(listener, d.stop) if listener is not None else None
        try:
            done = self.backend.complete(
                job.key_text, d.max_tokens, d.temperature, cache, tenant, d.seed, job.session,
                scanner,
            )  # fmt: skip
        except ValueError as error:  # over the context: name what the client can change
            too_long = d.max_tokens >= self.backend.context_tokens
            param = "max_tokens" if too_long else "messages" if job.route == "chat" else "prompt"
            raise bad_request(str(error), param) from None
        text, finish = apply_stop(done.text, d.stop, done.finish_reason)
        if scanner is not None:
            scanner.finish(text)  # raises GenerationCancelled if the listener stopped it
        # usage counts what is returned: a stop sequence cut the text, so its tokens are counted
        completion = done.completion_tokens if text == done.text else len(self.tokens(text))
        return Generation(text, finish, done.prompt_tokens, completion, done.cached_tokens)

    def tokens(self, text: str) -> list[int] | None:
        return self.backend.encode(text)

    def close(self) -> None:
        self.backend.close()


class UpstreamRunner:
    """An OpenAI-compatible server; one keep-alive HTTP client."""

    name = "openai"
    upstream = True

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url, self.model_id = root, model
        self._client = httpx.Client(
            base_url=root, headers=headers, timeout=timeout_s, transport=transport
        )

    def job(
        self, route: str, prompt: str | None, messages: list[Message] | None, decoding: Decoding
    ) -> Job:
        if messages is None:
            assert prompt is not None
            return Job(route, prompt, prompt, decoding, None, prompt)
        sent = [m.model_dump(exclude_none=True) for m in messages]
        key = orjson.dumps(sent, option=orjson.OPT_SORT_KEYS).decode()
        question, context = chat_parts(messages)
        return Job(route, key, plain_chat(messages), decoding, sent, question, context)

    def generate(
        self,
        job: Job,
        cache: HybridCache | None,
        tenant: str,
        listener: DecodeListener | None = None,
    ) -> Generation:
        d = job.decoding
        body: dict[str, Any] = {
            **d.extra, "model": self.model_id, "max_tokens": d.max_tokens,
            "temperature": d.temperature, "stream": False,
        }  # fmt: skip
        body.update({k: v for k, v in (("top_p", d.top_p), ("seed", d.seed)) if v is not None})
        if d.stop:
            body["stop"] = list(d.stop)
        if job.messages is not None:
            path, body["messages"] = "/v1/chat/completions", job.messages
        else:
            path, body["prompt"] = "/v1/completions", job.key_text
        if listener is not None:
            return self._stream(path, body, job, listener)
        reply = self._post(path, body)
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] if job.messages is not None else choice["text"]
            usage = reply.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            return Generation(
                str(text or ""), str(choice.get("finish_reason") or "stop"),
                int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                int(cached),
            )  # fmt: skip
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise _upstream_error(f"malformed reply ({error!r})") from None

    def _stream(
        self, path: str, body: dict[str, Any], job: Job, listener: DecodeListener
    ) -> Generation:
        """The upstream's SSE stream passed on as it arrives: `listener` hears each piece of
        text (stop sequences applied here too, whatever the server does with them) and stops
        the stream by returning False. The response header goes once the upstream accepted
        the request, before its usage says what its prefix cache reused: streamed, an
        upstream answer is reported as a `miss`."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        scanner = StopScanner(listener, job.decoding.stop)
        parts: list[str] = []
        ending: dict[str, Any] = {"finish": "stop", "usage": {}}
        started = time.perf_counter()
        try:
            request = self._client.build_request(
                "POST", path, content=orjson.dumps(body), headers=JSON_HEADERS
            )
            response = self._client.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    response.read()
                    raise _refusal(response)
                scanner.started(0)
                for piece in _pieces(_events(response), job.messages is not None, ending):
                    parts.append(piece)
                    if not scanner.text(piece):  # a stop sequence, or the client went away
                        break
            finally:
                response.close()  # (early: the upstream stops generating what nobody reads)
        except httpx.HTTPError as error:
            waited = time.perf_counter() - started
            raise _upstream_error(f"{type(error).__name__} after {waited:.1f} s") from None
        except ValueError as error:  # (orjson's decode error is one)
            raise _upstream_error(f"malformed stream event ({error})") from None
        if scanner.cancelled:
            raise GenerationCancelled("the client stopped reading the stream")
        text, finish = apply_stop("".join(parts), job.decoding.stop, ending["finish"])
        scanner.finish(text)
        usage = ending["usage"]
        return Generation(
            text, finish, int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
            int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        )  # fmt: skip

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            response = self._client.post(path, content=orjson.dumps(body),
                                         headers=JSON_HEADERS)  # fmt: skip
        except httpx.HTTPError as error:
            waited = time.perf_counter() - started
            raise _upstream_error(f"{type(error).__name__} after {waited:.1f} s") from None
        if response.status_code >= 400:
            raise _refusal(response)
        try:
            payload = response.json()
        except ValueError:
            raise _upstream_error("reply is not JSON") from None
        if not isinstance(payload, dict):
            raise _upstream_error("reply is not a JSON object")
        return payload

    def tokens(self, text: str) -> list[int] | None:
        return None  # the server's tokenizer is not here

    def close(self) -> None:
        self._client.close()


JSON_HEADERS = {"content-type": "application/json"}


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return " ".join(str(error["message"]).split())[:300]
    except (ValueError, AttributeError):
        pass
    return " ".join(response.text.split())[:300] or response.reason_phrase


def _refusal(response: httpx.Response) -> GatewayError:
    """The error of an upstream's 4xx/5xx reply."""
    if 400 <= response.status_code < 500 and response.status_code not in (401, 403):
        # the request's fault (a bad parameter): the client should see it as such
        return GatewayError(response.status_code, _message(response), "invalid_request_error")
    return _upstream_error(f"HTTP {response.status_code}: {_message(response)}")


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE stream, up to `[DONE]` (comments and blank lines skipped)."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        event = orjson.loads(data)
        if not isinstance(event, dict):
            raise ValueError("an event is not a JSON object")
        yield event


def _pieces(events: Iterator[dict[str, Any]], chat: bool, ending: dict[str, Any]) -> Iterator[str]:
    """The text pieces of a stream's events (a chat's `delta.content`, a completion's `text`),
    noting the finish reason and the usage in `ending` as they pass."""
    for event in events:
        usage, choices = event.get("usage"), event.get("choices") or []
        if not isinstance(choices, list) or not isinstance(usage or {}, dict):
            raise ValueError("choices must be a list and usage an object")
        ending["usage"] = usage or ending["usage"]
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(choice, dict) or (chat and not isinstance(delta, dict)):
                raise ValueError("a choice without its text")
            ending["finish"] = choice.get("finish_reason") or ending["finish"]
            piece = delta.get("content") if chat else choice.get("text")  # type: ignore[union-attr]
            if piece:
                yield str(piece)


def _upstream_error(reason: str) -> GatewayError:
    return GatewayError(502, f"upstream model server: {reason}", "upstream_error")

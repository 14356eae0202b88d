"""OpenAI response bodies: completions, chat, embeddings, errors, and SSE streams of chunks.

A stream is `data: <chunk JSON>\n\n` events ending with `data: [DONE]\n\n`, in OpenAI's chunk
shapes (`chat.completion.chunk` with a first role delta and a last finish-reason delta;
`text_completion` pieces), and a usage chunk with empty `choices` when the client asked for
`stream_options.include_usage`. The text is cut at word boundaries, so the pieces join back to
exactly the answer a non-streamed request gets.

Wiring without a FastAPI import of its own: this is the HTTP layer's wire format, the bodies and
events the routes of `flows.gateway.app` send, in OpenAI's shapes; what an answer is (text,
tokens, where it came from) is decided in `models.serving`.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from cache_runtime.serving.schemas import GatewayError
from models.serving.chain import Served

_PIECES = re.compile(r"\s*\S+|\s+$")  # words with their leading whitespace; trailing blanks
DONE = b"data: [DONE]\n\n"


def usage(served: Served) -> dict[str, Any]:
    return {
        "prompt_tokens": served.prompt_tokens,
        "completion_tokens": served.completion_tokens,
        "total_tokens": served.prompt_tokens + served.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": served.cached_tokens},
    }


def completion_body(served: Served, model: str) -> dict[str, Any]:
    choice = {"index": 0, "text": served.text, "logprobs": None,
              "finish_reason": served.finish_reason}  # fmt: skip
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": model, "choices": [choice], "usage": usage(served),
    }  # fmt: skip


def chat_body(served: Served, model: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": served.text}
    choice = {"index": 0, "message": message, "logprobs": None,
              "finish_reason": served.finish_reason}  # fmt: skip
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": model, "choices": [choice], "usage": usage(served),
    }  # fmt: skip


def pieces(text: str) -> list[str]:
    """`text` in word pieces that concatenate back to it exactly."""
    found = _PIECES.findall(text)
    assert "".join(found) == text
    return found


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class LiveStream:
    """The SSE events of one answer, as it comes: `opening`, a `piece` per text delta, then
    `closing` (finish reason, usage, `[DONE]`) or `error`."""

    def __init__(self, model: str, route: str) -> None:
        self.chat = route == "chat"
        self.head = {
            "id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()), "model": model,
        }  # fmt: skip

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def opening(self) -> list[bytes]:
        return [_event({**self.head, "choices": [self._choice("", None, role=True)]})] if (
            self.chat
        ) else []  # fmt: skip

    def piece(self, text: str) -> bytes:
        return _event({**self.head, "choices": [self._choice(text, None)]})

    def closing(self, served: Served, include_usage: bool) -> list[bytes]:
        finish = self._choice(None if self.chat else "", served.finish_reason)
        events = [_event({**self.head, "choices": [finish]})]
        if include_usage:
            events.append(_event({**self.head, "choices": [], "usage": usage(served)}))
        return [*events, DONE]

    def error(self, error: GatewayError) -> list[bytes]:
        """A failure after the stream began (the status was already sent): an error event."""
        return [b"data: " + orjson.dumps(error_body(error)) + b"\n\n", DONE]


def stream_events(served: Served, model: str, route: str, include_usage: bool) -> Iterator[bytes]:
    """The SSE events of a whole answer (a cache hit, or an upstream's), in word pieces."""
    stream = LiveStream(model, route)
    yield from stream.opening()
    for piece in pieces(served.text):
        yield stream.piece(piece)
    yield from stream.closing(served, include_usage)


def embeddings_body(vectors: list[list[float] | str], model: str, tokens: int) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {
        "object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }  # fmt: skip


# OpenAI's error `type` by status; `code` is the specific reason (a string, or null)
_ERROR_TYPES = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error",
                502: "server_error", 503: "server_error"}  # fmt: skip


def error_body(error: GatewayError) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}` as OpenAI sends it."""
    kind = _ERROR_TYPES.get(error.status) or (
        "invalid_request_error" if error.status < 500 else "server_error"
    )  # fmt: skip
    code = None if error.kind == kind else error.kind
    return {"error": {"message": error.message, "type": kind, "param": error.param,
                      "code": code}}  # fmt: skip

"""Streamed answers of the stand-in OpenAI server (`openai_server`): SSE chunks as the backend
decodes each token, in the shape vLLM and SGLang send them, so the gateway's pass-through of an
upstream stream is tested against a server that really streams.

The backend runs in a thread and hands each decoded piece to a queue; the response iterates the
queue. The first item is awaited before the response is returned, so a request the backend
refuses (a prompt over the context) is a 400 with OpenAI's error body, not a broken stream.
A client that goes away stops the generation at its next token (the listener returns False).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from fastapi.responses import StreamingResponse

from models.llm.backends import Completion, DecodeListener

Chunk = Callable[[str | None, str | None], dict[str, Any]]  # (text, finish) -> one event


class _Relay:
    """The backend's listener: decoded pieces into a queue, until the reader cancels."""

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.cancelled = threading.Event()

    def started(self, cached_tokens: int) -> None:
        self.items.put(None)  # decoding starts: the request was accepted

    def text(self, delta: str) -> bool:
        if self.cancelled.is_set():
            return False
        self.items.put(delta)
        return True


def stream_answer(
    run: Callable[[DecodeListener], Completion],
    chunk: Chunk,
    include_usage: bool,
    usage: Callable[[Completion], dict[str, Any]],
) -> StreamingResponse:
    """The SSE response of `run(listener)`: one `chunk(text, None)` per decoded piece, then
    `chunk(None, finish_reason)`, the usage event when `include_usage`, and `[DONE]`.

    Raises:
        whatever `run` raises before decoding starts (the handler turns it into an error).
    """
    relay = _Relay()

    def work() -> None:
        try:
            relay.items.put(run(relay))
        except BaseException as error:  # handed to the reader, raised or ending the stream
            relay.items.put(error)

    threading.Thread(target=work, name="preheat-stream", daemon=True).start()
    first = relay.items.get()
    if isinstance(first, BaseException):
        raise first

    def events() -> Iterator[bytes]:
        try:
            item = first
            while not isinstance(item, BaseException):  # an error mid-stream: no [DONE]
                if isinstance(item, str):
                    yield _sse(chunk(item, None))
                elif isinstance(item, Completion):
                    yield _sse(chunk(None, item.finish_reason))
                    if include_usage:
                        yield _sse({**chunk(None, None), "choices": [], "usage": usage(item)})
                    yield b"data: [DONE]\n\n"
                    return
                item = relay.items.get()
        finally:
            relay.cancelled.set()

    return StreamingResponse(events(), media_type="text/event-stream")


def chunk_maker(route: str, model: str) -> Chunk:
    """OpenAI's chunk of `route` ("completions" or "chat"), one id and time per answer."""
    answer_id, created = uuid.uuid4().hex, int(time.time())

    def completion_chunk(text: str | None, finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {
            "id": f"cmpl-{answer_id}", "object": "text_completion", "created": created,
            "model": model, "choices": [choice],
        }  # fmt: skip

    def chat_chunk(text: str | None, finish: str | None) -> dict[str, Any]:
        delta = {"role": "assistant", "content": text} if text is not None else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": f"chatcmpl-{answer_id}", "object": "chat.completion.chunk",
            "created": created, "model": model, "choices": [choice],
        }  # fmt: skip

    return chat_chunk if route == "chat" else completion_chunk


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"

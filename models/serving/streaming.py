"""Streaming a miss as the model decodes it: stop sequences on the way, and the SSE side.

The model runs in a worker thread (`HFBackend.complete` holds the model's lock); the response is
an async generator on the event loop. Between them a `StreamSink`: the chain calls `begin` once
the prefill is done (the response's headers can go: the outcome is known), the model's listener
hands it each decoded piece of text, and the generator forwards them as SSE chunks. When the
client goes away the generator's `finally` cancels the sink, the next token's listener call
returns False and the generation stops; a cancelled answer is never stored
(`GenerationCancelled`). An answer that ran to its end is stored whole by the chain, as a
non-streamed one is.

Rejected: transformers' `TextIteratorStreamer` with `model.generate` in a thread. The backend's
own decoding loop reuses the prefill's KV cache (restored pages included), which `generate`
would rebuild; a callback in that loop is all the streamer would add.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from models.llm.backends import DecodeListener


class GenerationCancelled(Exception):
    """The client stopped reading: the answer is incomplete, and must not be stored."""


class AnswerSink(Protocol):
    """Where the chain streams an answer the model computes (`StreamSink`)."""

    def begin(self, outcome: str, key: str | None) -> None: ...

    def text(self, delta: str) -> bool: ...


class StopScanner:
    """A `DecodeListener` that applies stop sequences to streamed text: text that could be the
    start of a stop sequence is held back until the next token decides, text after a stop
    sequence is never sent, and reaching one stops the generation."""

    def __init__(self, sink: DecodeListener, stop: Sequence[str]) -> None:
        self.sink, self.stop = sink, tuple(stop)
        self._text = ""  # everything decoded so far
        self._sent = 0  # how much of it went to the sink
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.cancelled = False

    def started(self, cached_tokens: int) -> None:
        self.sink.started(cached_tokens)

    def text(self, delta: str) -> bool:
        self._text += delta
        cuts = [i for i in (self._text.find(s) for s in self.stop) if i >= 0]
        end = min(cuts) if cuts else len(self._text) - self._hold
        if end > self._sent and not self._send(self._text[self._sent : end]):
            return False
        return not cuts

    def _send(self, piece: str) -> bool:
        self._sent += len(piece)
        if not self.sink.text(piece):
            self.cancelled = True
            return False
        return True

    def finish(self, final_text: str) -> None:
        """The generation ended with `final_text` (stop sequences applied): send what was held.

        Raises:
            GenerationCancelled: the sink stopped it before its end."""
        if self.cancelled:
            raise GenerationCancelled("the client stopped reading the stream")
        if len(final_text) > self._sent and not self._send(final_text[self._sent :]):
            raise GenerationCancelled("the client stopped reading the stream")


class StreamSink:
    """The worker thread's side (`begin`, `text`) and the event loop's (`began`,
    `pieces`, `cancel`) of one streamed answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._began = asyncio.Event()
        self._cancelled = threading.Event()
        self.outcome: str | None = None
        self.key: str | None = None

    # -- worker thread -------------------------------------------------------------------------

    def begin(self, outcome: str, key: str | None) -> None:
        """The model is about to decode: the response can start (`outcome`: its header)."""
        self.outcome, self.key = outcome, key
        self._loop.call_soon_threadsafe(self._began.set)

    def text(self, delta: str) -> bool:
        if self._cancelled.is_set():
            return False
        self._loop.call_soon_threadsafe(self._queue.put_nowait, delta)
        return True

    # -- event loop ----------------------------------------------------------------------------

    async def began(self, work: asyncio.Future[Any]) -> bool:
        """True once `begin` was called; False if `work` finished first (a cache hit, an
        error, or a runner that does not stream)."""
        waiting = asyncio.ensure_future(self._began.wait())
        done, _ = await asyncio.wait({waiting, work}, return_when=asyncio.FIRST_COMPLETED)
        if waiting not in done:
            waiting.cancel()
        return self._began.is_set()

    async def pieces(self, work: asyncio.Future[Any]) -> AsyncIterator[str]:
        """The text as it is decoded, until `work` (the generation) is done."""
        while True:
            getting = asyncio.ensure_future(self._queue.get())
            done, _ = await asyncio.wait({getting, work}, return_when=asyncio.FIRST_COMPLETED)
            if getting in done:
                yield getting.result()
                continue
            getting.cancel()
            while not self._queue.empty():
                yield self._queue.get_nowait()
            return

    def cancel(self) -> None:
        self._cancelled.set()

"""An upstream's SSE stream read by `UpstreamRunner`: pieces passed on as they arrive, stop
sequences applied, a client that leaves closes the upstream's stream, and a broken stream is a
one-line 502. (The pass-through against a real streaming server: tests/integration/
test_gateway_upstream.py; here the streams are ones no well-behaved server sends.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from cache_runtime.serving.schemas import GatewayError
from models.serving.runners import Job, UpstreamRunner
from models.serving.streaming import GenerationCancelled
from models.serving.validity import Decoding


class Listener:
    def __init__(self, leave_after: int | None = None) -> None:
        self.pieces: list[str] = []
        self.began: list[int] = []
        self.leave_after = leave_after

    def started(self, cached_tokens: int) -> None:
        self.began.append(cached_tokens)

    def text(self, delta: str) -> bool:
        self.pieces.append(delta)
        return self.leave_after is None or len(self.pieces) < self.leave_after


class Upstream(httpx.SyncByteStream):
    """A completion stream of `events`, noting how far it was read and whether it was closed."""

    def __init__(self, events: list[Any]) -> None:
        self.events, self.sent, self.closed = events, 0, False

    def __iter__(self) -> Iterator[bytes]:
        for event in self.events:
            self.sent += 1
            data = event if isinstance(event, bytes) else orjson.dumps(event)
            yield b"data: " + data + b"\n\n"
        yield b"data: [DONE]\n\n"

    def close(self) -> None:
        self.closed = True


def piece(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def runner_over(stream: Upstream, status: int = 200) -> tuple[UpstreamRunner, list[Any]]:
    bodies: list[Any] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(orjson.loads(request.content))
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "max_tokens is too large"}})
        return httpx.Response(200, stream=stream, headers={"content-type": "text/event-stream"})

    return UpstreamRunner("http://gpu-0:8000", "m", transport=httpx.MockTransport(handle)), bodies


def job(stop: tuple[str, ...] = ()) -> Job:
    return Job("completions", "Fees?", "Fees?", Decoding(max_tokens=16, temperature=0, stop=stop))


def test_pieces_pass_through_and_usage_comes_from_the_last_event() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 3,
             "prompt_tokens_details": {"cached_tokens": 2}}  # fmt: skip
    stream = Upstream([piece("Wire"), piece(" fees"), piece(" apply", "length"),
                       {"choices": [], "usage": usage}])  # fmt: skip
    runner, bodies = runner_over(stream)
    listener = Listener()

    done = runner.generate(job(), None, "acme", listener)

    assert listener.pieces == ["Wire", " fees", " apply"] and listener.began == [0]
    assert (done.text, done.finish_reason) == ("Wire fees apply", "length")
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (3, 3, 2)
    assert bodies[0]["stream"] is True and bodies[0]["stream_options"] == {"include_usage": True}


def test_a_stop_sequence_ends_the_stream_even_if_the_upstream_ignores_it() -> None:
    stream = Upstream([piece("Fees: 5"), piece(" EUR\n"), piece("Q: more"), piece(" text")])
    runner, _ = runner_over(stream)
    listener = Listener()

    done = runner.generate(job(stop=("\n",)), None, "acme", listener)

    assert (done.text, done.finish_reason) == ("Fees: 5 EUR", "stop")
    assert "".join(listener.pieces) == "Fees: 5 EUR" and stream.closed
    assert stream.sent == 2  # nothing read after the stop


def test_a_client_that_leaves_closes_the_upstream_stream() -> None:
    stream = Upstream([piece(f" w{i}") for i in range(50)])
    runner, _ = runner_over(stream)

    with pytest.raises(GenerationCancelled):
        runner.generate(job(), None, "acme", Listener(leave_after=2))
    assert stream.closed and stream.sent < 50


@pytest.mark.parametrize(
    "event", [b"{not json", b"[1, 2]", orjson.dumps({"choices": "text"}),
              orjson.dumps({"choices": [{"delta": "x"}], "usage": 3})],
)  # fmt: skip
def test_a_broken_stream_is_a_one_line_502(event: bytes) -> None:
    runner, _ = runner_over(Upstream([piece("ok"), event]))

    with pytest.raises(GatewayError) as caught:
        runner.generate(job(), None, "acme", Listener())
    assert caught.value.status == 502 and "malformed stream event" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_upstream_refusal_reaches_the_client_as_its_own_400() -> None:
    runner, _ = runner_over(Upstream([]), status=400)
    listener = Listener()

    with pytest.raises(GatewayError) as caught:
        runner.generate(job(), None, "acme", listener)
    assert caught.value.status == 400 and "max_tokens is too large" in str(caught.value)
    assert listener.began == []  # no response was started for it

"""Gateway overhead of a cache hit on loopback (issue 9 goal: p50 under 2 ms, model excluded).

Two servers in this process, each uvicorn on its own free 127.0.0.1 port, asked over one
keep-alive `httpx` connection each, alternately, so machine noise falls on both alike:

- **echo**: a bare FastAPI endpoint that reads the body and answers a fixed JSON of the same
  size class — what any Python HTTP service costs on this machine;
- **gateway hit**: `POST /v1/completions` for a prompt already cached (`exact-memory`): key
  check, parsing, the validity rule, the exact key, the memory tier, usage counting with the
  model's tokenizer, the OpenAI body, metrics and the request-log call. The model never runs.

`overhead_p50_ms` = p50(gateway hit) - p50(echo). Also reported: the hit through the official
`openai` client (what an application sees), and with a Redis tier configured behind memory
(`--redis`: a hit is still answered by memory; the request log then goes to Redis Streams).

Usage: python benchmarks/gateway_overhead.py [--requests 2000] [--redis]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from flows.gateway import CACHE_HEADER, GatewayConfig, create_app
from models.llm.openai_server import serve_in_thread
from models.serving.runners import InProcessRunner

KEY = "sk-bench"
PROMPT = "What is the fee for an international wire transfer from a premium account?"


def echo_app() -> FastAPI:
    app = FastAPI()
    body = orjson.dumps({"id": "x" * 36, "object": "text_completion", "choices": [{"text": "y"}]})

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        await request.body()
        return Response(body, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b"{}", media_type="application/json")

    return app


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 4),
        "p90_ms": round(at(0.9) * 1000, 4),
        "p99_ms": round(at(0.99) * 1000, 4),
    }


def timed(call: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def openai_client_hits(gateway_url: str, model_id: str, n: int) -> list[float]:
    """`n` cache hits through the official `openai` client: what an application sees."""
    import openai

    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=KEY, max_retries=0)
    try:
        return timed(
            lambda: client.completions.create(
                model=model_id, prompt=PROMPT, temperature=0, max_tokens=16
            ),
            n,
        )
    finally:
        client.close()


def measure(requests: int, redis_url: str | None, work: Path) -> dict[str, Any]:
    import torch

    from models.llm.backends import HFBackend
    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    backend = HFBackend.from_path(save_tiny_llm(work / "tiny-gpt2"), device="cpu")
    config = GatewayConfig(
        keys={KEY: "bench"}, data_dir=work / "data", redis_url=redis_url, ssd_bytes=0,
        semantic=False, templates=False, memory_bytes=64 << 20,
    )  # fmt: skip
    with ExitStack() as stack:
        stack.callback(backend.close)
        gateway_url, stop_gateway = serve_in_thread(
            create_app(config, runner=InProcessRunner(backend))
        )
        stack.callback(stop_gateway)
        echo_url, stop_echo = serve_in_thread(echo_app())
        stack.callback(stop_echo)
        headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
        body = orjson.dumps(
            {"model": backend.model_id, "prompt": PROMPT, "temperature": 0, "max_tokens": 16}
        )
        gateway = stack.enter_context(httpx.Client(base_url=gateway_url, headers=headers))
        echo = stack.enter_context(httpx.Client(base_url=echo_url, headers=headers))
        miss = gateway.post("/v1/completions", content=body)
        assert miss.headers[CACHE_HEADER] == "miss", miss.text

        def hit() -> None:
            reply = gateway.post("/v1/completions", content=body)
            assert reply.headers[CACHE_HEADER] == "exact-memory"

        def bare() -> None:
            echo.post("/echo", content=body)

        timed(hit, 200), timed(bare, 200)  # warm both paths
        hits, bares = [], []
        for _ in range(requests // 100):
            hits += timed(hit, 100)
            bares += timed(bare, 100)
        through_client = openai_client_hits(gateway_url, backend.model_id, max(100, requests // 4))
    gateway_p, echo_p = percentiles(hits), percentiles(bares)
    return {
        "requests": len(hits),
        "redis_tier": redis_url is not None,
        "gateway_hit": gateway_p,
        "echo": echo_p,
        "overhead_p50_ms": round(gateway_p["p50_ms"] - echo_p["p50_ms"], 4),
        "goal_p50_ms": 2.0,
        "openai_client_hit": percentiles(through_client),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--redis", action="store_true", help="a Redis tier behind memory")
    args = parser.parse_args(argv)
    if args.requests < 100:
        parser.error("--requests must be >= 100")
    with tempfile.TemporaryDirectory(prefix="preheat-gw-bench-") as scratch, ExitStack() as stack:
        redis_url = None
        if args.redis:
            from cache_runtime.services import RedisServer

            redis_url = stack.enter_context(RedisServer()).url
        result = measure(args.requests, redis_url, Path(scratch))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

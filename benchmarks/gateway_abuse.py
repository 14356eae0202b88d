"""The gateway as one client may push it: streaming's first chunk, and fairness under abuse.

On 127.0.0.1, in this process: the gateway (uvicorn, the tiny GPT-2 in process, the memory tier,
semantic lookups off), then two measurements printed as one JSON object:

- `streaming`: `--streams` streamed misses of `--stream-tokens` tokens (sampled, so each is
  computed), each timed to its first content chunk and to its end; the goal is a median
  `first_chunk_share` (first chunk / total) of at most 0.2.
- `fairness`: tenant "calm" sends `--calm` sequential small misses alone (idle), then again while
  tenant "flood" sends, from `--flooders` concurrent clients as fast as they can, 2 MB bodies,
  requests whose `max_tokens` is beyond the context, and maximal valid ones (the most tokens the
  context allows). Reported: calm's p50/p95 idle and under the flood and their ratio (goal: p95
  within 1.5x), and the flood's refusals (413 / 400 / 429) with their p95 latency (goal: 50 ms).

Usage: python benchmarks/gateway_abuse.py [--streams 10] [--stream-tokens 200] [--calm 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from flows.gateway import GatewayConfig, create_app
from models.llm.openai_server import serve_in_thread
from models.serving.runners import InProcessRunner

KEYS = {"sk-calm": "calm", "sk-flood": "flood"}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def streaming(url: str, model: str, streams: int, tokens: int) -> dict[str, Any]:
    shares, firsts, totals = [], [], []
    headers = {"Authorization": "Bearer sk-calm"}
    for i in range(streams):
        body = {"model": model, "prompt": f"Stream {uuid.uuid4().hex} number {i}:",
                "max_tokens": tokens, "temperature": 0.7, "stream": True}  # fmt: skip
        started = time.perf_counter()
        first = None
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                          timeout=120) as reply:  # fmt: skip
            for line in reply.iter_lines():
                if first is None and line.startswith("data: {") and '"text":""' not in line:
                    first = time.perf_counter() - started
        total = time.perf_counter() - started
        firsts.append(first or total)
        totals.append(total)
        shares.append((first or total) / total)
    return {
        "streams": streams, "tokens": tokens,
        "first_chunk_ms_p50": round(statistics.median(firsts) * 1000, 1),
        "total_ms_p50": round(statistics.median(totals) * 1000, 1),
        "first_chunk_share_p50": round(statistics.median(shares), 4),
        "first_chunk_share_max": round(max(shares), 4), "goal_share": 0.2,
    }  # fmt: skip


async def _calm(http: httpx.AsyncClient, model: str, n: int) -> list[float]:
    times = []
    for i in range(n):
        body = {"model": model, "prompt": f"Calm {uuid.uuid4().hex} {i}?", "max_tokens": 8,
                "temperature": 0}  # fmt: skip
        started = time.perf_counter()
        reply = await http.post("/v1/completions", json=body)
        reply.raise_for_status()
        times.append(time.perf_counter() - started)
    return times


async def _flood(
    http: httpx.AsyncClient, model: str, context: int, stop: asyncio.Event
) -> list[tuple[int, float]]:
    big = b'{"model": "m", "prompt": "' + b"x" * (2 << 20) + b'"}'
    kinds = [
        ("oversized", {"content": big}),
        ("beyond_context", {"json": {"model": model, "prompt": "q", "max_tokens": context * 4}}),
        (
            "maximal",
            {
                "json": {
                    "model": model,
                    "prompt": "q",
                    "max_tokens": context - 8,
                    "temperature": 0.7,
                }
            },
        ),
    ]
    seen: list[tuple[int, float]] = []
    n = 0
    while not stop.is_set():
        _, options = kinds[n % len(kinds)]
        n += 1
        started = time.perf_counter()
        reply = await http.post("/v1/completions", **options)
        seen.append((reply.status_code, time.perf_counter() - started))
    return seen


async def fairness(url: str, model: str, context: int, calm: int, flooders: int) -> dict[str, Any]:
    # Every client is built before any request is timed: building one blocks this event loop for
    # ~20 ms (httpx loads its TLS context), which a request already under way would count.
    calm_client = httpx.AsyncClient(
        base_url=url, headers={"Authorization": "Bearer sk-calm"}, timeout=120
    )
    headers = {"Authorization": "Bearer sk-flood", "content-type": "application/json"}
    clients = [
        httpx.AsyncClient(base_url=url, headers=headers, timeout=120) for _ in range(flooders)
    ]
    idle = await _calm(calm_client, model, calm)
    stop = asyncio.Event()
    floods = [asyncio.create_task(_flood(http, model, context, stop)) for http in clients]
    await asyncio.sleep(1.0)  # the flood under way
    loaded = await _calm(calm_client, model, calm)
    stop.set()
    seen = [s for task in floods for s in await task]
    for http in [calm_client, *clients]:
        await http.aclose()
    refused = [s for s in seen if s[0] in (400, 413, 429)]
    refusal_ms = {
        str(code): round(_p([t for c, t in seen if c == code], 0.95) * 1000, 1)
        for code in (400, 413, 429)
        if any(c == code for c, _ in seen)
    }
    by_status: dict[str, int] = {}
    for status, _ in seen:
        by_status[str(status)] = by_status.get(str(status), 0) + 1

    def ms(values: list[float]) -> dict[str, float]:
        return {"p50": round(_p(values, 0.5) * 1000, 1), "p95": round(_p(values, 0.95) * 1000, 1)}

    return {
        "calm_idle_ms": ms(idle),
        "calm_under_flood_ms": ms(loaded),
        "p95_ratio": round(_p(loaded, 0.95) / _p(idle, 0.95), 3), "goal_p95_ratio": 1.5,
        "flood_requests_by_status": by_status,
        "refusals_p95_ms": round(_p([s[1] for s in refused], 0.95) * 1000, 1) if refused else None,
        "refusals_p95_ms_by_status": refusal_ms,
        "goal_refusal_ms": 50,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--stream-tokens", type=int, default=200)
    parser.add_argument("--calm", type=int, default=40)
    parser.add_argument("--flooders", type=int, default=4)
    args = parser.parse_args(argv)
    import torch

    from models.llm.backends import HFBackend
    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="preheat-gw-abuse-") as scratch:
        work = Path(scratch)
        backend = HFBackend.from_path(save_tiny_llm(work / "tiny-gpt2"), device="cpu")
        config = GatewayConfig(keys=KEYS, data_dir=work / "data", ssd_bytes=0, semantic=False,
                               templates=False, refresh_s=0, log_requests=False)  # fmt: skip
        app = create_app(config, runner=InProcessRunner(backend))
        url, stop = serve_in_thread(app)
        try:
            result = {
                "streaming": streaming(url, backend.model_id, args.streams, args.stream_tokens),
                "fairness": asyncio.run(
                    fairness(
                        url, backend.model_id, backend.context_tokens, args.calm, args.flooders
                    )
                ),
            }
        finally:
            stop()
            backend.close()
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The gateway under load through a Redis crash (goals: zero failed requests through a Redis
restart under load; KV-page and embedding hit ratios during the outage within 5% of before;
`/healthz` says degraded within 2 s of the kill).

On 127.0.0.1, in this process: a `redis-server` this script owns, the gateway (uvicorn, the tiny
GPT-2 in process, memory + Redis tiers, the live request log on Redis Streams; semantic lookups
off to leave the two CPUs to the model), and `--clients` asyncio clients, each on its own
keep-alive `httpx` connection, sending greedy completions for `--duration` seconds: with
probability `--hit-share` one of `--hot` prompts cached before the run (an exact hit), else a
prompt never sent before (a miss: the model answers, the answer is written through to memory and
Redis). A `--kv-share` of the requests are sampled completions (temperature 0.7: no answer is
cached) of one of the hot prompts' long shared prefixes with a new tail, which only KV pages can
help (`prefix` when they did), and an `--embedding-share` are embeddings of hot texts (an exact
hit when cached). At `--kill-at` of the run Redis gets SIGKILL; at `--restart-at` it is started
again, empty, on the same port; `/healthz` is polled every 20 ms from the kill until it says
degraded. An error is any reply that is not 200 or any exception. Answers cannot be validated
while Redis is down (generations), so their hits become misses then: by design, not an error.

Prints one JSON object: requests, errors (the goal: 0) with up to 5 samples, p50/p95 of hits
and misses over the whole run and per phase (before the kill, during the outage, after the
restart), the Redis failures absorbed on the way (the Redis tier's errors, its refused writes,
the request-log records spooled to disk), and the hit overhead p50 measured afterwards the way
`gateway_overhead.py` does (a hit minus a bare FastAPI echo, sequential, keep-alive).

Usage: python benchmarks/gateway_load.py [--clients 8] [--duration 30] [--hit-share 0.7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

from cache_runtime.services import find_redis_server, free_port
from flows.gateway import CACHE_HEADER, GatewayConfig, create_app
from models.llm.openai_server import serve_in_thread
from models.serving.runners import InProcessRunner

KEY = "sk-load"
EMBEDDING_MODEL = "all-minilm-l6-v2"
TOPICS = ("wire transfers", "card limits", "mortgage rates", "savings interest", "overdrafts",
          "account closure", "fraud reports", "branch hours", "loan terms", "fx rates")  # fmt: skip


def _overhead_bench() -> Any:
    """`gateway_overhead.py` beside this script (a script, not an importable package module):
    its echo app, timer and percentiles, so both benchmarks measure overhead the same way."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gateway_overhead", Path(__file__).with_name("gateway_overhead.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OwnedRedis:
    """A redis-server on a fixed loopback port that can be SIGKILLed and started again there
    (`cache_runtime.services.RedisServer` stops politely and picks a new port each time)."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port, self.workdir = port, workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [str(find_redis_server()), "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--loglevel", "warning", "--logfile", "redis.log"]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 15
        try:
            while time.monotonic() < deadline:
                try:
                    if client.info("server")["process_id"] == self.process.pid:
                        return
                except redis.ConnectionError:
                    pass
                time.sleep(0.02)  # polling for PING, not a blind wait
        finally:
            client.close()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None


@dataclass
class Sample:
    started: float  # seconds since the run began
    seconds: float
    hit: bool  # the request was for a cached prompt
    source: str  # x-preheat-cache, or what went wrong
    ok: bool  # HTTP 200 with an answer
    kind: str = "answer"  # answer | kv | embedding


HOT_TEXT = "Our bank's policy on {topic}, in full detail, for every kind of account. " * 4


def _request(
    rng: random.Random, seed: int, n: int, hot: list[str], shares: tuple[float, float, float]
) -> tuple[str, bool, str, dict[str, Any]]:
    """(kind, hit, path, body additions) of the next request."""
    hit_share, kv_share, embedding_share = shares
    draw = rng.random()
    topic = rng.choice(TOPICS)
    if draw < kv_share:
        prompt = HOT_TEXT.format(topic=topic) + f" Client {seed} question {n}?"
        return "kv", True, "/v1/completions", {"prompt": prompt, "temperature": 0.7}
    if draw < kv_share + embedding_share:
        return "embedding", True, "/v1/embeddings", {"input": f"Embedding of {topic}"}
    hit = rng.random() < hit_share
    prompt = rng.choice(hot) if hit else f"Client {seed} request {n}: {topic}?"
    return "answer", hit, "/v1/completions", {"prompt": prompt}


async def client_loop(
    url: str,
    body: dict[str, Any],
    hot: list[str],
    stop_at: float,
    seed: int,
    shares: tuple[float, float, float],
) -> list[Sample]:
    rng, samples, began = random.Random(seed), [], time.perf_counter()
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        n = 0
        while time.perf_counter() < stop_at:
            n += 1
            kind, hit, path, extra = _request(rng, seed, n, hot, shares)
            payload = {**body, **extra}
            if kind == "embedding":
                payload = {"model": EMBEDDING_MODEL, "input": extra["input"]}
            started = time.perf_counter()
            try:
                reply = await http.post(path, content=orjson.dumps(payload))
                ok = reply.status_code == 200 and bool(reply.json().get("choices") or
                                                       reply.json().get("data"))  # fmt: skip
                source = reply.headers.get(CACHE_HEADER, "") if ok else (
                    f"HTTP {reply.status_code}: {reply.text[:120]}"
                )  # fmt: skip
            except (httpx.HTTPError, ValueError, KeyError) as error:
                ok, source = False, f"{type(error).__name__}: {error}"[:160]
            done = time.perf_counter()
            samples.append(Sample(started - began, done - started, hit, source, ok, kind))
    return samples


def hit_ratio(samples: list[Sample], kind: str) -> float | None:
    """Of `kind`'s answered requests, the share the cache helped: a KV prefix reused (`prefix`)
    for kv, a cached answer or embedding (`exact-...`) otherwise."""
    mine = [s for s in samples if s.kind == kind and s.ok and s.hit]
    if not mine:
        return None
    helped = "prefix" if kind == "kv" else "exact-"
    return round(sum(s.source.startswith(helped) for s in mine) / len(mine), 4)


async def degraded_after(url: str, killed: float, timeout_s: float = 10.0) -> float | None:
    """Seconds from `killed` (perf_counter) until /healthz says degraded (None: not in time)."""
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while time.perf_counter() - killed < timeout_s:
            if (await http.get("/healthz")).json().get("status") == "degraded":
                return round(time.perf_counter() - killed, 3)
            await asyncio.sleep(0.02)  # polling the health endpoint, as a load balancer does
    return None


def latency(samples: list[Sample]) -> dict[str, Any]:
    ok = [s.seconds for s in samples if s.ok]
    if not ok:
        return {"n": 0}
    p50 = statistics.median(ok)
    return {"n": len(ok), "p50_ms": round(p50 * 1000, 3), "p95_ms": round(_p95(ok) * 1000, 3)}


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from models.llm.backends import HFBackend
    from models.llm.registry import save_tiny_llm

    torch.set_num_threads(1)
    server = OwnedRedis(free_port(), work)
    server.start()
    with ExitStack() as stack:
        stack.callback(server.kill)
        backend = HFBackend.from_path(save_tiny_llm(work / "tiny-gpt2"), device="cpu")
        stack.callback(backend.close)
        config = GatewayConfig(
            keys={KEY: "load"}, data_dir=work / "data", redis_url=server.url, ssd_bytes=0,
            memory_bytes=128 << 20, semantic=False, templates=False, refresh_s=0,
        )  # fmt: skip
        app = create_app(config, runner=InProcessRunner(backend))
        url, stop = serve_in_thread(app)
        stack.callback(stop)
        body = {"model": backend.model_id, "temperature": 0, "max_tokens": args.max_tokens}
        hot = [f"Hot question {i} about {TOPICS[i % len(TOPICS)]}?" for i in range(args.hot)]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
            for prompt in hot:  # cached before the run: these are the hits
                http.post("/v1/completions", json={**body, "prompt": prompt}).raise_for_status()
            for topic in TOPICS:  # the KV pages of the shared prefixes, and the embeddings
                prefix = {**body, "prompt": HOT_TEXT.format(topic=topic), "temperature": 0.7}
                http.post("/v1/completions", json=prefix).raise_for_status()
                vector = {"model": EMBEDDING_MODEL, "input": f"Embedding of {topic}"}
                http.post("/v1/embeddings", json=vector).raise_for_status()
        samples, events = asyncio.run(load(args, url, body, hot, server))
        metrics = httpx.get(f"{url}/metrics").text
        overhead = hit_overhead(url, {**body, "prompt": hot[0]})
        gateway = app.state.gateway
        (redis_tier,) = [t for t in gateway.cache.tiers if t.name == "redis"]
        absorbed = {
            "redis_tier_errors": redis_tier.stats().errors,
            "redis_writes_refused": _sample_sum(metrics, "preheat_cache_writes_total",
                                                tier="redis", result="refused"),
            "request_log_spooled": gateway.producer.stats.spooled,
            # the restarted (empty) Redis filling again: the tier recovered on its own
            "redis_keys_after_restart": redis.Redis.from_url(server.url).dbsize(),
        }  # fmt: skip
    return summary(args, samples, events, absorbed, overhead)


async def load(
    args: argparse.Namespace, url: str, body: dict[str, Any], hot: list[str], server: OwnedRedis
) -> tuple[list[Sample], dict[str, float]]:
    began = time.perf_counter()
    stop_at = began + args.duration
    shares = (args.hit_share, args.kv_share, args.embedding_share)
    clients = [
        asyncio.create_task(client_loop(url, body, hot, stop_at, seed, shares))
        for seed in range(args.clients)
    ]
    events: dict[str, float] = {}
    await asyncio.sleep(args.kill_at * args.duration)
    server.kill()
    killed = time.perf_counter()
    events["killed_at_s"] = killed - began
    degraded = await degraded_after(url, killed)
    events["healthz_degraded_after_s"] = -1.0 if degraded is None else degraded
    await asyncio.sleep(max(0.0, args.restart_at * args.duration - (time.perf_counter() - began)))
    await asyncio.to_thread(server.start)  # the clients keep going while it starts
    events["restarted_at_s"] = time.perf_counter() - began
    results = await asyncio.gather(*clients)
    return [s for samples in results for s in samples], events


def hit_overhead(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """p50 of a sequential hit minus p50 of a bare echo, alternating, as gateway_overhead."""
    bench = _overhead_bench()
    echo_url, stop_echo = serve_in_thread(bench.echo_app())
    payload = orjson.dumps(body)
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    try:
        with (
            httpx.Client(base_url=url, headers=headers) as gw,
            httpx.Client(base_url=echo_url, headers=headers) as echo,
        ):
            hits, bares = [], []
            for _ in range(5):
                hits += bench.timed(lambda: gw.post("/v1/completions", content=payload), 100)
                bares += bench.timed(lambda: echo.post("/echo", content=payload), 100)
    finally:
        stop_echo()
    gateway_p, echo_p = bench.percentiles(hits[50:]), bench.percentiles(bares[50:])
    return {"gateway_hit_p50_ms": gateway_p["p50_ms"], "echo_p50_ms": echo_p["p50_ms"],
            "overhead_p50_ms": round(gateway_p["p50_ms"] - echo_p["p50_ms"], 4)}  # fmt: skip


def _sample_sum(metrics: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus exposition's samples `name` carrying `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        found.value
        for family in text_string_to_metric_families(metrics)
        for found in family.samples
        if found.name == name and labels.items() <= found.labels.items()
    )


def summary(
    args: argparse.Namespace,
    samples: list[Sample],
    events: dict[str, float],
    absorbed: dict[str, float],
    overhead: dict[str, Any],
) -> dict[str, Any]:
    errors = [s for s in samples if not s.ok]
    phases = {
        "before": lambda s: s.started < events["killed_at_s"],
        "during": lambda s: events["killed_at_s"] <= s.started < events["restarted_at_s"],
        "after": lambda s: s.started >= events["restarted_at_s"],
    }
    return {
        "clients": args.clients, "duration_s": args.duration, "hit_share": args.hit_share,
        "requests": len(samples), "errors": len(errors),
        "error_samples": sorted({s.source for s in errors})[:5],
        "redis": {k: round(v, 3) for k, v in events.items()},
        "hits": latency([s for s in samples if s.hit and s.kind == "answer"]),
        "misses": latency([s for s in samples if not s.hit and s.kind == "answer"]),
        "phases": {
            name: {"hits": latency([s for s in samples if s.hit and inside(s)]),
                   "misses": latency([s for s in samples if not s.hit and inside(s)]),
                   "hit_ratio": {kind: hit_ratio([s for s in samples if inside(s)], kind)
                                 for kind in ("answer", "kv", "embedding")}}
            for name, inside in phases.items()
        },
        "served_as": _count(s.source for s in samples if s.ok),
        "failures_absorbed": absorbed,
        "hit_overhead": overhead, "goal_overhead_p50_ms": 2.0,
    }  # fmt: skip


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--hit-share", type=float, default=0.7)
    parser.add_argument("--kv-share", type=float, default=0.2)
    parser.add_argument("--embedding-share", type=float, default=0.2)
    parser.add_argument("--hot", type=int, default=50, help="prompts cached before the run")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--kill-at", type=float, default=1 / 3, help="share of the run")
    parser.add_argument("--restart-at", type=float, default=2 / 3, help="share of the run")
    args = parser.parse_args(argv)
    if not (0 < args.kill_at < args.restart_at < 1) or args.clients < 1 or args.duration < 3:
        parser.error("need 0 < --kill-at < --restart-at < 1, --clients >= 1, --duration >= 3")
    with tempfile.TemporaryDirectory(prefix="preheat-gw-load-") as scratch:
        result = run(args, Path(scratch))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

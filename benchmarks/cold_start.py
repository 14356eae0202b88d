"""A node's cold start through the gateway, with and without warm-up (goal: warm-up cuts the p95
TTFT of the first two minutes after the restart by at least 40%).

On 127.0.0.1: a `redis-server` (`cache_runtime.services.RedisServer`), `preheat gateway` in a
subprocess serving a GPT-2-small-shaped model on CPU (12 layers, 768 wide, random weights: the
compute costs what the shape costs; its embedding sized to the MiniLM tokenizer the demo model
ships, so every sampled token decodes to text), and the `openai` client replaying a slice of the
Mooncake trace at its arrival times, one thread per request, `stream=True`. TTFT is the time from
sending a request to its first streamed chunk carrying text.

Prompts follow the trace's prefix structure: block id -> `--tokens-per-block` words drawn from
the tokenizer's whole-word vocabulary by a generator seeded with (seed, id), one token each, so
equal ids give equal token blocks and requests share exactly the prefixes the trace says (cut at
the model's context). Requests are sampled by prefix root (SHARDS-style spatial sampling: a root
is in or out, so every reuse inside a kept root stays), which lowers the rate to what one CPU
model serves at `--utilisation` while two minutes of trace stay two minutes of wall time
(`--time-scale` 1); the share is chosen from the node's measured cost per request and token.

Which caches it exercises: KV prefix pages only. Requests sample (temperature 0.7, `max_tokens`
1): no answer is stored or served from the cache, and semantic lookups are off, so every request
runs the model and only its prefill shrinks (what cold starts cost: prefill and queueing).

The slice is the trace's first `--requests`; the restart comes `--window` seconds (trace time)
before its end. The history up to the window before the restart is sent back to back (two in
flight, so the node is never idle: it learns the same prefixes, and the lake logs the same
requests, in less wall time, though closer together); the window before the restart and the one
after it are sent at their arrival times. Then the gateway is stopped (its memory gone), its SSD
directory wiped and the Redis flushed: a replacement node whose node-local Redis starts empty
(the embedded default keeps no data). Rejected: keeping the Redis tier, which holds every page
here (no budget binds), so the restart would cost one Redis read a chain and warm-up could not
show anything; and a Redis byte budget, whose eviction would also take the request log. The
request log is drained into the lake first (`preheat ingest-stream`), as a live ingester would
have. Both arms restart from this one history (the state a restart leaves is the same). Arm
"off": a fresh gateway, traffic resumes. Arm "on": a fresh gateway, `preheat warmup` plans from
the lake (no forecaster is trained here: it says it scored by recency and frequency) and warms
the node's SSD and Redis (its wall time reported; traffic waits for it), then traffic resumes.
The trace's clock pauses during restarts in both arms.

Prints one JSON object: the scaling, the measured utilisation (share of time a request was in
the node: one model, so its busy fraction) of the two minutes before the restart, TTFT p50/p95
before and after for both arms, warm-up wall seconds and items, and the p95 cut (on vs off).
Figures come from a 2-core machine shared with other work: noisy.

Usage: python benchmarks/cold_start.py [--requests 3000] [--seed 0] [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

# a script: its own directory is first on sys.path (tests put it there too)
from cold_start_parts import (
    KEY,
    PAGE,
    Arrival,
    Node,
    PromptBuilder,
    busy_fraction,
    log,
    predicted_busy_s,
    read_trace,
    replay,
    root_sample,
    save_gpt2_small,
    send,
    ttft,
)

TRACE = Path(__file__).resolve().parents[1] / "../shared/data/traces/mooncake_synthetic_trace.jsonl"


def calibrate(node: Node, model: str, builder: PromptBuilder, max_tokens: int) -> dict[str, float]:
    """Seconds a request costs besides its prompt, and per prefilled token: medians of three
    sequential misses of fresh prompts (words no block draws in this order) of 16 and 256."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{node.url}/v1", api_key=KEY, max_retries=0, timeout=900)
    long = min(256, builder.max_blocks * builder.tokens_per_block)

    def cost(n: int) -> float:
        times = []
        for i in range(3):
            words = random.Random(f"probe:{n}:{i}").choices(builder.words, k=n)
            sample = send(client, model, " ".join(words), max_tokens, time.perf_counter())
            times.append(sample.done - sample.sent)
        return statistics.median(times)

    short_s, long_s = cost(PAGE), cost(long)
    per_token = max(0.0, (long_s - short_s) / (long - PAGE))
    return {"request_s": round(max(0.0, short_s - PAGE * per_token), 4),
            "token_ms": round(per_token * 1000, 4)}  # fmt: skip


def choose_share(args: argparse.Namespace, arrivals: list[Arrival], restart: float,
                 builder: PromptBuilder, cost: dict) -> tuple[float, float]:  # fmt: skip
    """(the largest root share at which the node serves the window before the restart at
    `--utilisation`, that utilisation as predicted from `cost`)."""
    predicted, since = 0.0, restart - args.window
    for step in range(20, 0, -1):
        share = step / 20
        before = [a for a in root_sample(arrivals, share, args.seed) if a.at < restart]
        busy = predicted_busy_s(before, builder, cost, since)
        predicted = busy / (args.window * args.time_scale)
        if predicted <= args.utilisation:
            return share, round(predicted, 3)
    return 0.05, round(predicted, 3)


def offsets(arrivals: Sequence[Arrival], since: float, builder: PromptBuilder,
            scale: float) -> list[tuple[float, str]]:  # fmt: skip
    return [((a.at - since) * scale, builder.prompt(a.blocks)) for a in arrivals]


def restarted(arm: str, node: Node, redis_url: str, prompts: list[tuple[float, str]],
              args: argparse.Namespace, cost: dict) -> dict[str, Any]:  # fmt: skip
    """A replacement node (memory gone, SSD wiped, Redis empty), warmed or not, then traffic."""
    import redis

    shutil.rmtree(node.data_dir / "cache" / "ssd", ignore_errors=True)
    redis.Redis.from_url(redis_url).flushdb()
    model = node.start()
    log(f"arm {arm}: node up")
    try:
        warm = None
        if arm == "on":
            summary, wall = node.preheat(
                "warmup", "--model-path", str(node.model), "--json", "--memory-mb", "0",
                "--ssd-mb", str(node.tiers_mb[1]), "--compute-s", str(args.warmup_s),
                "--deadline-s", str(1.5 * args.warmup_s),
                "--prefill-ms-per-token", str(max(cost["token_ms"], 1e-3)),
            )  # fmt: skip
            plan = summary.get("plan", {})
            warm = {"wall_s": round(wall, 1), "items_done": summary.get("done"),
                    "items_failed": summary.get("failed"), "unresolved": summary.get("unresolved"),
                    "planned": plan.get("planned"), "candidates": plan.get("candidates"),
                    "planned_compute_s": plan.get("compute_s"),
                    "forecaster": plan.get("forecaster") or plan.get("fallback")}  # fmt: skip
            log(f"arm on: warm-up {warm}")
        samples = replay(node.url, model, prompts, args.max_tokens)
    finally:
        node.stop()
    end = args.window * args.time_scale
    return {"after": ttft(samples), "utilisation_after": busy_fraction(samples, 0.0, end),
            "warmup": warm}  # fmt: skip


def build_model(quick: bool, directory: Path, seed: int) -> tuple[Path, dict[str, Any]]:
    """(saved model directory, its description): the tiny demo GPT-2 for `--quick`."""
    from transformers import AutoConfig

    if quick:
        from models.llm.registry import save_tiny_llm

        save_tiny_llm(directory, seed)
    else:
        save_gpt2_small(directory, seed)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    n, d, vocab = config.n_layer, config.n_embd, config.vocab_size
    parameters = vocab * d + config.n_positions * d + n * (12 * d * d + 13 * d) + 2 * d
    return directory, {"name": "tiny-gpt2" if quick else "gpt2-small shape", "layers": n,
                       "width": d, "vocab": vocab, "context": config.n_positions,
                       "parameters": parameters, "device": "cpu", "torch_threads": 1}  # fmt: skip


def before_restart(node: Node, model: str, args: argparse.Namespace, arrivals: list[Arrival],
                   restart: float, builder: PromptBuilder) -> dict[str, Any]:  # fmt: skip
    """Calibrate, choose the root share, send the early history back to back and the window
    before the restart at its arrival times; what happened, with the window's samples."""
    log(f"node up ({model}); calibrating")
    cost = calibrate(node, model, builder, args.max_tokens)
    share, predicted = (
        (args.root_share, None) if args.root_share
        else choose_share(args, arrivals, restart, builder, cost)
    )  # fmt: skip
    kept = root_sample(arrivals, share, args.seed)
    since = restart - args.window
    history = [a for a in kept if a.at < since]
    window = [a for a in kept if since <= a.at < restart]
    log(f"cost {cost}; root share {share}: {len(history)} + {len(window)} requests")
    began = time.perf_counter()
    early = replay(node.url, model, [(0.0, builder.prompt(a.blocks)) for a in history],
                   args.max_tokens, workers=2)  # fmt: skip
    forward_s = time.perf_counter() - began
    before = replay(node.url, model, offsets(window, since, builder, args.time_scale),
                    args.max_tokens)  # fmt: skip
    replayed = {"history_back_to_back": len(history), "history_wall_s": round(forward_s, 1),
                "history_errors": sum(s.error is not None for s in early),
                "before_window": len(window)}  # fmt: skip
    return {"cost": cost, "share": share, "predicted": predicted, "before": before,
            "replayed": replayed}  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from cache_runtime.services import RedisServer

    arrivals = read_trace(args.trace, args.requests)
    restart = arrivals[-1].at - args.window if arrivals else 0.0
    if restart < args.window:
        raise ValueError(f"the slice spans {restart + args.window:.0f} s of trace: it needs "
                         f"two windows of {args.window:g} s (more --requests)")  # fmt: skip
    model_dir, described = build_model(args.quick, work / "model", args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    room = described["context"] - args.max_tokens - 1
    builder = PromptBuilder(tokenizer, args.tokens_per_block, room, args.seed)
    with RedisServer() as server:
        node = Node(model_dir, work / "node", server.url, (args.memory_mb, args.ssd_mb))
        model = node.start()
        try:
            served = before_restart(node, model, args, arrivals, restart, builder)
        finally:
            node.stop()
        ingested, ingest_s = node.preheat("ingest-stream")
        log(f"restart: ingested {ingested} in {ingest_s:.1f} s")
        kept = [a for a in root_sample(arrivals, served["share"], args.seed) if a.at >= restart]
        after = offsets(kept, restart, builder, args.time_scale)
        cost = served["cost"]
        arms = {arm: restarted(arm, node, server.url, after, args, cost) for arm in ("off", "on")}
    for result in arms.values():
        result["before"] = ttft(served["before"])  # one history for both arms
    span = args.window * args.time_scale
    off, on = arms["off"]["after"].get("p95_ms"), arms["on"]["after"].get("p95_ms")
    return {
        "model": described, "trace": str(args.trace), "slice_requests": len(arrivals),
        "replayed": {**served["replayed"], "after": len(after)},
        "scaling": {"tokens_per_block": args.tokens_per_block, "time_scale": args.time_scale,
                    "root_share": served["share"], "window_s": args.window,
                    "restart_at_s": round(restart, 1), "max_tokens": args.max_tokens,
                    "calibration": cost, "utilisation_target": args.utilisation,
                    "utilisation_predicted": served["predicted"],
                    "utilisation_before": busy_fraction(served["before"], 0.0, span)},
        "ingest": {**ingested, "wall_s": round(ingest_s, 1)},
        "redis_at_restart": "flushed: a replacement node with an empty node-local Redis",
        "arms": arms, "goal_p95_cut": 0.4,
        "p95_cut_after": round(1 - on / off, 3) if off and on is not None else None,
        "note": "2 shared CPU cores (other work running): figures are noisy",
    }  # fmt: skip


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (the CLI contract)
        sys.stderr.write(f"cold_start.py: {message}\n")
        raise SystemExit(2)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--trace", type=Path, default=TRACE.resolve(), help="Mooncake JSONL")
    add("--requests", type=int, default=3000, help="the trace's first N requests")
    add("--seed", type=int, default=0)
    add("--out", type=Path, help="also write the JSON here")
    add("--quick", action="store_true", help="smoke run: tiny model, short windows")
    add("--tokens-per-block", type=int, default=4, help="tokens a 512-token block becomes")
    add("--time-scale", type=float, default=1.0, help="wall seconds per trace second")
    add("--window", type=float, default=120.0, help="trace seconds after (and before) restart")
    add("--utilisation", type=float, default=0.6, help="target busy share before the restart")
    add("--root-share", type=float, help="share of prefix roots replayed (default: chosen)")
    add("--max-tokens", type=int, default=1)
    add("--warmup-s", type=float, default=60.0, help="warm-up compute budget, seconds")
    add("--memory-mb", type=int, default=512)
    add("--ssd-mb", type=int, default=4096)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.window = min(args.requests, 80), min(args.window, 6.0)
        args.root_share, args.warmup_s = args.root_share or 1.0, min(args.warmup_s, 10.0)
    if not args.trace.is_file():
        parser.error(f"{args.trace}: no such trace file")
    if (
        min(args.requests, args.tokens_per_block, args.max_tokens) < 1
        or min(args.time_scale, args.window, args.warmup_s) <= 0
        or not (0 < args.utilisation <= 1 and 0 < (args.root_share or 1) <= 1)
    ):
        parser.error("need positive counts and times, 0 < --utilisation, --root-share <= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="preheat-cold-start-") as scratch:
        try:
            result = run(args, Path(scratch))
        except (ValueError, KeyError, orjson.JSONDecodeError) as err:
            sys.stderr.write(f"cold_start.py: {' '.join(str(err).split())}\n")
            return 2
    text = orjson.dumps(result).decode()
    if args.out:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

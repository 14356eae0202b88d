"""The pieces of `cold_start.py`: the trace slice and its prompts, the model, the node (a
`preheat gateway` subprocess), the streaming client and the statistics. See that script."""

from __future__ import annotations

import functools
import hashlib
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

KEY, TENANT = "sk-cold-start", "cold-start"
PAGE = 16  # tokens per KV page (cache_runtime.kv_pages.PAGE_TOKENS)
TEMPERATURE = 0.7


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds since the slice began, trace time
    blocks: tuple[int, ...]  # the trace's hash ids


def read_trace(path: Path, requests: int) -> list[Arrival]:
    """The trace's first `requests` rows (Mooncake JSONL: timestamp ms, hash_ids)."""
    rows = []
    with path.open("rb") as lines:
        for line in lines:
            if len(rows) == requests:
                break
            if line.strip():
                row = orjson.loads(line)
                rows.append((row["timestamp"] / 1000, tuple(int(h) for h in row["hash_ids"])))
    start = rows[0][0] if rows else 0.0
    return [Arrival(t - start, blocks) for t, blocks in rows if blocks]


def root_sample(arrivals: Sequence[Arrival], share: float, seed: int) -> list[Arrival]:
    """The arrivals whose first block hashes below `share`: whole prefix trees in or out."""

    def kept(root: int) -> bool:
        digest = hashlib.blake2b(f"{seed}:{root}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < share * 2**64

    return [a for a in arrivals if kept(a.blocks[0])]


class PromptBuilder:
    """Prompts from block ids: each id -> `tokens_per_block` whole words, one token each."""

    def __init__(self, tokenizer: Any, tokens_per_block: int, max_tokens: int, seed: int) -> None:
        vocab = sorted(w for w in tokenizer.get_vocab() if w.isascii() and w.isalpha())
        self.words = [w for w in vocab if len(w) >= 3]
        self.tokens_per_block, self.seed = tokens_per_block, seed
        self.max_blocks = max_tokens // tokens_per_block

    def block(self, block_id: int) -> str:
        rng = random.Random(f"{self.seed}:{block_id}")
        return " ".join(rng.choices(self.words, k=self.tokens_per_block))

    def prompt(self, blocks: Sequence[int]) -> str:
        return " ".join(self.block(b) for b in blocks[: self.max_blocks])

    def tokens(self, blocks: Sequence[int]) -> int:
        return self.tokens_per_block * min(len(blocks), self.max_blocks)


def save_gpt2_small(directory: Path, seed: int = 0) -> Path:
    """GPT-2 small's shape (GPT2Config defaults) with the MiniLM tokenizer the demo model ships,
    random weights, saved for `preheat gateway --model-path`; nothing is downloaded."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from models.tiny_llm import load_tokenizer

    tokenizer = load_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.cls_token_id,
                        eos_token_id=tokenizer.sep_token_id)  # fmt: skip
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class Node:
    """One serving node: `preheat gateway` in a subprocess on its data dir and the Redis."""

    def __init__(self, model: Path, data_dir: Path, redis_url: str, tiers_mb: tuple[int, int]):
        self.model, self.data_dir, self.tiers_mb = model, data_dir, tiers_mb
        self.env = {**os.environ, "PREHEAT_REDIS_URL": redis_url,
                    "PREHEAT_DATA_DIR": str(data_dir),
                    "PREHEAT_MLFLOW_URI": f"sqlite:///{data_dir.parent / 'none.db'}",
                    "PREHEAT_GATEWAY_KEYS": orjson.dumps({KEY: TENANT}).decode(),
                    "PREHEAT_GATEWAY_TENANT_QUEUE": "100000", "PREHEAT_GATEWAY_TEMPLATES": "0",
                    "PREHEAT_GATEWAY_FORECAST": "0", "PREHEAT_GATEWAY_REFRESH_S": "0",
                    "OMP_NUM_THREADS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "DO_NOT_TRACK": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def preheat(self, *args: str) -> tuple[dict[str, Any], float]:
        """(the JSON a `preheat` command printed, its wall seconds)."""
        started = time.perf_counter()
        done = subprocess.run([_preheat(), *args], env=self.env, capture_output=True, check=False)
        if done.returncode:
            raise RuntimeError(f"preheat {args[0]}: {done.stderr.decode()[-400:]}")
        return orjson.loads(done.stdout.splitlines()[-1]), time.perf_counter() - started

    def start(self) -> str:
        from cache_runtime.services import free_port

        port = free_port()
        memory, ssd = self.tiers_mb
        self.process = subprocess.Popen(
            [_preheat(), "gateway", "--model-path", str(self.model), "--port", str(port),
             "--no-semantic", "--memory-mb", str(memory), "--ssd-mb", str(ssd)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return httpx.get(f"{self.url}/v1/models", headers=_auth()).json()["data"][0][
                        "id"
                    ]
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polling for the node's health, as a load balancer does
        raise RuntimeError("the gateway did not come up")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def log(message: str) -> None:
    """Progress on stderr (stdout is the JSON)."""
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")


def _preheat() -> str:
    beside = Path(sys.executable).with_name("preheat")
    return str(beside) if beside.exists() else shutil.which("preheat") or "preheat"


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


@dataclass
class Sample:
    sent: float  # wall seconds since the phase began
    ttft: float
    done: float  # wall seconds since the phase began
    cached_tokens: int
    error: str | None = None


def send(client: Any, model: str, prompt: str, max_tokens: int, began: float) -> Sample:
    """One streamed completion; TTFT to its first chunk with text (else to its end)."""
    sent = time.perf_counter()
    first, cached, error = None, 0, None
    try:
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=TEMPERATURE,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter()
            if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    except Exception as failure:  # an error is a sample too: counted, never dropped
        error = f"{type(failure).__name__}: {failure}"[:160]
    done = time.perf_counter()
    return Sample(sent - began, (first or done) - sent, done - began, cached, error)


def replay(
    url: str, model: str, prompts: list[tuple[float, str]], max_tokens: int, workers: int = 256
) -> list[Sample]:
    """Send each (wall offset, prompt) at its offset, `workers` at most in flight (offsets 0
    and 2 workers: back to back, the node never idle); the samples in order."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=900)
    began = time.perf_counter()

    def at(item: tuple[float, str]) -> Sample:
        time.sleep(max(0.0, began + item[0] - time.perf_counter()))  # the arrival time
        return send(client, model, item[1], max_tokens, began)

    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(prompts)))) as pool:
        return list(pool.map(at, prompts))


@functools.cache
def sibling(name: str) -> Any:
    """The script `name`.py beside this one (scripts, not package modules), imported once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)  # registered first: its dataclasses look their module up
    return module


def ttft(samples: Sequence[Sample]) -> dict[str, Any]:
    """n, errors, p50/p95 TTFT (ms) and the mean share of prompt tokens read from KV pages."""
    ok = [s for s in samples if s.error is None]
    if not ok:
        return {"n": 0, "errors": len(samples)}
    times = [s.ttft for s in ok]
    return {
        "n": len(ok), "errors": len(samples) - len(ok),
        "p50_ms": round(statistics.median(times) * 1000, 1),
        "p95_ms": round(sibling("gateway_load")._p95(times) * 1000, 1),
        "cached_tokens_mean": round(statistics.fmean(s.cached_tokens for s in ok), 1),
    }  # fmt: skip


def busy_fraction(samples: Sequence[Sample], start: float, end: float) -> float:
    """Share of [start, end] with at least one request in the node (one model: its busy time)."""
    busy, reach = 0.0, start
    for s in sorted(samples, key=lambda s: s.sent):
        lo, hi = max(s.sent, reach), min(s.done, end)
        if hi > lo:
            busy, reach = busy + hi - lo, hi
    return round(busy / (end - start), 3) if end > start else 0.0


def predicted_busy_s(
    arrivals: Sequence[Arrival], builder: PromptBuilder, cost: dict, since: float = -math.inf
) -> float:
    """Model seconds the arrivals from `since` on cost with every page of all of `arrivals`
    kept (the trace's own reuse, no restart): `cost` per request and per token computed."""
    seen: set[int] = set()
    busy = 0.0
    for a in arrivals:
        n, lead = builder.tokens(a.blocks), 0
        while lead < len(a.blocks) and a.blocks[lead] in seen:
            lead += 1
        cached = min(n - 1, PAGE * (builder.tokens_per_block * lead // PAGE))
        if a.at >= since:
            busy += cost["request_s"] + cost["token_ms"] / 1000 * (n - cached)
        seen.update(a.blocks)
    return busy

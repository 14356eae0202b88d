"""The replay's latency model: the engine a request waits for, and what a cached block saves.

A request's service is the load of its cached blocks' KV from the tiers that held them (only
while every block before was cached too: a prefix cache cannot use a block after a miss) plus
the prefill of its other prompt tokens; it waits for one of `servers` prefill servers, FIFO,
with chunked prefill (`queueing.simulate_queue`); TTFT = its first token's time - its arrival +
a fixed overhead (`base_ms`: tokenisation, scheduling, the first decode step). The quadratic
part of attention is left out: the model prices what the cache and the queue change.

`REFERENCE` is a 7-8B model on one data-centre GPU per server, orders of magnitude, sourced in
its comment. `measure_latency` measures the costs on this machine instead: prefill
milliseconds per token of the configured model (the tiny GPT-2 unless a local checkpoint is
named) and the time to read one block's worth of that model's KV from each tier. A model is
measured once per comparison and every arm is priced by it; `to_dict` / `load` pin one in a
file, so later runs compare against the same engine.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson

from cache_runtime.traces import MOONCAKE_BLOCK_TOKENS

TokenCount = TypeVar("TokenCount", float, np.ndarray)  # ms per count: one, or element-wise
# Prefill servers of the reference engine: data-parallel replicas of a 7-8B model, one GPU
# each, fed by one queue. How many is a fact of the deployment (`--servers`); the default is
# sized to the shipped Mooncake trace (3,993 requests, 61M prompt tokens in 1,022 s): 10 keep
# them 42% busy at 1x with warm-up off and 81% at 2x (93% after restarts), the regime of the
# seed's production figures (94% -> 61%), where a cold node's extra prefill fills the queue.
# 8 at 2x are overloaded (98%: the queue grows without bound), 16 hardly queue at all (50%).
REFERENCE_SERVERS = 10
CHUNK_TOKENS = 512  # Sarathi-Serve's and vLLM's usual chunked-prefill budget per iteration


@dataclass(frozen=True)
class ReplayLatency:
    """Costs in milliseconds; `load_ms_per_block` maps a tier name to one block's load;
    `servers` prefill servers take `chunk_tokens` prompt tokens per iteration."""

    prefill_ms_per_token: float
    load_ms_per_block: dict[str, float] = field(default_factory=dict)
    base_ms: float = 20.0
    source: str = "reference"
    servers: int = REFERENCE_SERVERS
    chunk_tokens: int = CHUNK_TOKENS

    def __post_init__(self) -> None:
        if self.servers < 1 or self.chunk_tokens < 1:
            raise ValueError("--servers and chunk_tokens must be at least 1")
        if self.prefill_ms_per_token < 0 or self.base_ms < 0:
            raise ValueError("latency costs must be non-negative")

    def prefill_ms(self, tokens: TokenCount) -> TokenCount:
        """A recompute of `tokens` prompt tokens (a count, or an array of counts)."""
        return self.prefill_ms_per_token * tokens

    def with_servers(self, servers: int | None) -> ReplayLatency:
        return self if servers is None else replace(self, servers=servers)

    def for_block_tokens(self, block_tokens: int) -> ReplayLatency:
        """This engine for blocks of `block_tokens` instead of `MOONCAKE_BLOCK_TOKENS` (the
        platform's 16-token pages): a load moves bytes, so it scales with the tokens; prefill is
        per token already."""
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        scale = block_tokens / MOONCAKE_BLOCK_TOKENS
        loads = {tier: ms * scale for tier, ms in self.load_ms_per_block.items()}
        return replace(self, load_ms_per_block=loads)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplayLatency:
        """The inverse of `to_dict`; a `ValueError` naming what is missing or wrong."""
        try:
            return cls(
                prefill_ms_per_token=float(data["prefill_ms_per_token"]),
                load_ms_per_block={k: float(v) for k, v in data["load_ms_per_block"].items()},
                base_ms=float(data["base_ms"]),
                source=str(data["source"]),
                servers=int(data.get("servers", REFERENCE_SERVERS)),
                chunk_tokens=int(data.get("chunk_tokens", CHUNK_TOKENS)),
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a latency model: {err!r}") from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))

    @classmethod
    def load(cls, path: Path) -> ReplayLatency:
        """A model pinned by `save` (or the `latency_model` object of a replay's JSON)."""
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read a latency model ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a latency model is a JSON object")
        return cls.from_dict(data.get("latency_model", data))


# Llama-3-8B (32 layers, 8 KV heads of 128, bf16: 128 KiB of KV per token, 64 MiB per 512-token
# block) on one A100 per prefill server:
# - prefill 0.1 ms per token (10,000 tokens/s): a forward pass costs 2 x 8e9 FLOP per token
#   (Kaplan et al. 2020, "Scaling laws", C_forward ~ 2N), an A100 gives 312 TFLOP/s dense in
#   bf16 (NVIDIA's A100 datasheet), and prefill in chunks of 512 tokens or more runs at about
#   half of it (Sarathi-Serve, Agrawal et al., OSDI 2024, whose chunked-prefill scheduler the
#   queue follows, measured on Mistral-7B on one A100). Published cross-check: MLPerf Inference
#   v5.1's Llama-3.1-8B (CNN/DailyMail summarisation: prompts of ~800 tokens, several times the
#   outputs), one H100 with vLLM in FP8, 5,777 generated tokens/s offline (Red Hat's
#   submission, 2025): tens of thousands of prompt tokens a second on a GPU of ~6x an A100's
#   dense bf16 peak (H100 FP8: 1,979 TFLOP/s), i.e. several thousand to 10,000 per A100 in
#   bf16. An order of magnitude, not a benchmark
#   of any one engine: `--latency measured` or a pinned file (`load`) replaces it;
# - loads: 64 MiB from host memory over PCIe 4.0 x16 (~25 GB/s) 2.7 ms; from one NVMe SSD
#   (~7 GB/s) 10 ms; from a Redis (one instance copies large values at a few GB/s) ~20 ms.
REFERENCE = ReplayLatency(
    prefill_ms_per_token=0.1,
    load_ms_per_block={"memory": 2.7, "ssd": 10.0, "redis": 20.0},
    base_ms=20.0,
    source="reference: Llama-3-8B-class model, one A100 per prefill server, orders of magnitude",
    servers=REFERENCE_SERVERS,
    chunk_tokens=CHUNK_TOKENS,
)


def pinned_latency(kind: str, servers: int | None) -> ReplayLatency | None:
    """The model `kind` names without measuring: `reference`, or a JSON file an earlier run
    pinned (its JSON output, or its `latency_model` object); None for `measured` (measure it).
    `servers`, when given, replaces the model's prefill servers."""
    if kind == "measured":
        return None
    if kind == "reference":
        return REFERENCE.with_servers(servers)
    path = Path(kind)
    if not path.is_file():
        raise ValueError(f"--latency {kind!r}: choose reference or measured, or a JSON file")
    return ReplayLatency.load(path).with_servers(servers)


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _prefill_ms_per_token(model_path: Path | None) -> tuple[float, int, str]:
    """(ms per token, KV bytes per token, model name) from timing a 512-token prefill."""
    import torch

    from models.tiny_llm import build_tiny_gpt2

    torch.set_num_threads(1)
    if model_path is None:
        model, _ = build_tiny_gpt2(n_positions=MOONCAKE_BLOCK_TOKENS)
        name = "tiny-gpt2"
    else:
        from transformers import AutoModelForCausalLM

        model, name = AutoModelForCausalLM.from_pretrained(str(model_path)).eval(), model_path.name
    tokens = torch.randint(0, model.config.vocab_size, (1, MOONCAKE_BLOCK_TOKENS))
    with torch.no_grad():
        model(tokens, logits_to_keep=1)  # warm the allocator before timing
        ms = _median_ms(lambda: model(tokens, logits_to_keep=1), repeats=5)
    config = model.config
    kv_bytes_per_token = 2 * config.num_hidden_layers * config.hidden_size * 4  # K and V, fp32
    return ms / MOONCAKE_BLOCK_TOKENS, kv_bytes_per_token, name


def measure_latency(
    redis_client: Any | None = None,
    model_path: Path | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    servers: int = REFERENCE_SERVERS,
) -> ReplayLatency:
    """Measure prefill and per-tier loads of one `block_tokens` block on this machine (ms);
    `servers` prefill servers of this machine's speed serve the trace.

    512 is Mooncake's block; the platform's own logs hash 16-token KV pages."""
    from cache_runtime.tiers.memory import MemoryTier
    from cache_runtime.tiers.ssd import SSDTier

    per_token, kv_per_token, name = _prefill_ms_per_token(model_path)
    block = bytes(kv_per_token * block_tokens)
    loads = {}
    memory = MemoryTier(4 * len(block), policy="lru")
    memory.put("probe", block)
    loads["memory"] = _median_ms(lambda: memory.get("probe"), repeats=50)
    with tempfile.TemporaryDirectory() as tmp:
        ssd = SSDTier(Path(tmp), 4 * len(block))
        ssd.put("probe", block)
        loads["ssd"] = _median_ms(lambda: ssd.get("probe"), repeats=30)
        ssd.close()
    if redis_client is not None:
        from cache_runtime.tiers.redis_tier import RedisTier

        redis = RedisTier(redis_client, namespace="preheat-latency-probe", bulk_connections=1)
        redis.put("probe", block)
        loads["redis"] = _median_ms(lambda: redis.get("probe"), repeats=30)
        redis.delete("probe")
    return ReplayLatency(
        prefill_ms_per_token=per_token,
        load_ms_per_block={tier: round(ms, 4) for tier, ms in loads.items()},
        base_ms=REFERENCE.base_ms,
        source=f"measured on this machine: {name} prefill on CPU, {len(block)} B KV per block",
        servers=servers,
        chunk_tokens=CHUNK_TOKENS,
    )

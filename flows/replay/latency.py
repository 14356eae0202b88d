"""The replay's latency model: what a cached block saves, priced from measured costs.

Time to first token (TTFT) of a request = a fixed overhead + for each of its prompt blocks either
the cost of loading the block's KV from the tier that held it (only while every block before it
was cached too: a prefix cache cannot use a block after a miss) or the cost of prefilling its
tokens. Queueing and the quadratic part of attention are left out; the model prices what the
cache changes.

`measure_latency` measures the costs on this machine: prefill milliseconds per token of the
configured model (the tiny GPT-2 unless a local checkpoint is named) and the time to read one
block's worth of that model's KV from each tier. `REFERENCE` holds orders of magnitude of a
7-8B model on one data-centre GPU, for comparing with published numbers.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

BLOCK_TOKENS = 512  # Mooncake's block
TokenCount = TypeVar("TokenCount", float, np.ndarray)  # ms per count: one, or element-wise


@dataclass(frozen=True)
class ReplayLatency:
    """Costs in milliseconds; `load_ms_per_block` maps a tier name to one block's load."""

    prefill_ms_per_token: float
    load_ms_per_block: dict[str, float] = field(default_factory=dict)
    base_ms: float = 20.0
    source: str = "reference"

    def prefill_ms(self, tokens: TokenCount) -> TokenCount:
        """A recompute of `tokens` prompt tokens (a count, or an array of counts)."""
        return self.prefill_ms_per_token * tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


REFERENCE = ReplayLatency(
    prefill_ms_per_token=40.0 / BLOCK_TOKENS,  # ~40 ms per 512-token block
    load_ms_per_block={"memory": 0.5, "ssd": 4.0, "redis": 2.0},
    base_ms=20.0,
    source="reference: 7-8B model on one data-centre GPU, orders of magnitude",
)


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
        model, _ = build_tiny_gpt2(n_positions=BLOCK_TOKENS)
        name = "tiny-gpt2"
    else:
        from transformers import AutoModelForCausalLM

        model, name = AutoModelForCausalLM.from_pretrained(str(model_path)).eval(), model_path.name
    tokens = torch.randint(0, model.config.vocab_size, (1, BLOCK_TOKENS))
    with torch.no_grad():
        model(tokens, logits_to_keep=1)  # warm the allocator before timing
        ms = _median_ms(lambda: model(tokens, logits_to_keep=1), repeats=5)
    config = model.config
    kv_bytes_per_token = 2 * config.num_hidden_layers * config.hidden_size * 4  # K and V, fp32
    return ms / BLOCK_TOKENS, kv_bytes_per_token, name


def measure_latency(
    redis_client: Any | None = None,
    model_path: Path | None = None,
    block_tokens: int = BLOCK_TOKENS,
) -> ReplayLatency:
    """Measure prefill and per-tier loads of one `block_tokens` block on this machine (seconds).

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
    )

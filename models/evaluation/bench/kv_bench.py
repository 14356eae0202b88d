"""`preheat bench kv`: time to first token with a prefix's KV restored, against recomputing it.

For each prompt length, one prompt of random token ids is prefilled cold (the whole prompt), and
then with its prefix restored: from the `DynamicCache` kept in this process (the physical limit:
nothing to load), from the memory tier, the SSD tier and a private Redis. A restore covers the
full pages of all the prompt's tokens but the last (as `HFBackend` does: next-token logits need
one computed token), and its TTFT is the load plus the prefill of the uncached suffix. Redis is
also read page by page (one GET a page, the way chains were read before batched reads), in
one single batch (one MGET, no read-ahead) and in chunks of two pages read ahead (the seed's
schedule: two pages to start on, then two at a time while earlier ones are used), beside the
default doubling read-ahead. Under
`redis_transport`, the same pages' bytes are fetched with the bare client, nothing decoded or
promoted (MGETs of 64 pages, then one GET per page): the floor of any Redis restore, and a
measure of what round trips cost at this page size (at GPT-2 small's 1.2 MB pages on a local
Redis, the bytes cost far more than the round trips).

The model is built from a config with random weights: the compute costs what the shape costs,
the text is meaningless. GPT-2 small's shape (124M parameters; its context stretched to the
longest prompt) in fp32 on CPU; a 1.1B Llama shape (TinyLlama's) in bf16 on CUDA. Each way is
checked against the cold prefill: the next-token logits must agree, or the run fails (a restore
that is fast and wrong is worth nothing).

Caveat: the SSD tier's files were just written, so the OS page cache holds them; the SSD
figure is a lower bound of a read from the device.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cache_runtime.hybrid import HybridCache
from cache_runtime.kv_pages import (
    MAX_CHUNK_PAGES,
    PAGE_TOKENS,
    decode_page,
    encode_page,
    kv_cache_of,
    load_prefix,
    page_keys,
    store_prefix,
)
from cache_runtime.services import RedisServer
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

LENGTHS = (512, 2048, 8192)
MAX_LENGTH = 32_768  # a longer prompt's cold prefill would not fit this machine's memory
TENANT, MODEL_ID = "bench", "kv-bench"
# bf16 on a GPU can differ from fp32 order-of-summation noise; fp32 on CPU agrees far closer
LOGIT_TOLERANCE = {"cpu": 1e-3, "cuda": 5e-2}


def build_model(device: str, max_tokens: int) -> tuple[Any, dict[str, Any]]:
    """(model in eval mode on `device`, its description) for `device`'s default shape."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if device == "cuda":
        config: Any = LlamaConfig(
            hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
            num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
            max_position_embeddings=max(max_tokens, 2048),
        )  # fmt: skip
        name, dtype = "llama-1.1b (TinyLlama's shape)", torch.bfloat16
    else:
        config = GPT2Config(n_positions=max(max_tokens, 1024))
        name, dtype = "gpt2-small (124M shape)", torch.float32
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype).eval()
    parameters = sum(p.numel() for p in model.parameters())
    described = {
        "name": name, "parameters": parameters, "dtype": str(dtype).removeprefix("torch."),
        "layers": config.num_hidden_layers, "threads": torch.get_num_threads(),
    }  # fmt: skip
    return model, described


class _Timer:
    """Median wall milliseconds of a call, synchronising CUDA so that queued work counts."""

    def __init__(self, device: str, repeats: int) -> None:
        import torch

        self._sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.repeats = repeats

    def median_ms(
        self, run: Callable[[Any], Any], prepare: Callable[[], Any] = lambda: None
    ) -> float:
        """`run(prepare())`, timing `run` only."""
        samples = []
        for _ in range(self.repeats):
            state = prepare()
            self._sync()
            started = time.perf_counter()
            run(state)
            self._sync()
            samples.append((time.perf_counter() - started) * 1000)
        return round(statistics.median(samples), 2)


def _page_by_page(cache: HybridCache, tokens: Sequence[int], config: Any) -> tuple[Any, int]:
    """A chain read one page per round trip, concatenated at the end (the read before batched
    chain reads): the baseline of `redis_page_by_page_ms`."""
    import torch

    pages, parent = [], None
    for key in page_keys(TENANT, MODEL_ID, tokens):
        data = cache.get(key, parent=parent)
        if data is None:
            break
        pages.append(decode_page(data, like=pages[0] if pages else None))
        parent = key
    per_layer = [
        (torch.cat([p[i][0] for p in pages], dim=2), torch.cat([p[i][1] for p in pages], dim=2))
        for i in range(len(pages[0]))
    ]  # n pages of (1, heads, 16, d) -> (1, heads, 16n, d) per layer
    return kv_cache_of(per_layer, config), len(pages) * PAGE_TOKENS


def bench_kv(
    lengths: Sequence[int] = LENGTHS, repeats: int = 3, device: str | None = None
) -> dict[str, Any]:
    """The JSON object of `preheat bench kv` (shape in issue 22)."""
    import torch

    if not lengths or any(length < 2 * PAGE_TOKENS for length in lengths):
        raise ValueError(f"--lengths must each be at least {2 * PAGE_TOKENS} tokens")
    if max(lengths) > MAX_LENGTH:
        raise ValueError(f"--lengths must each be at most {MAX_LENGTH} tokens")
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, described = build_model(device, max(lengths))
    timer = _Timer(device, repeats)
    result: dict[str, Any] = {"model": described, "device": device, "repeats": repeats}
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="preheat-kv-") as tmp:
        client = redis_client(server.url)
        result["lengths"] = {
            str(length): _one_length(model, length, timer, client, Path(tmp) / str(length))
            for length in lengths
        }
        client.close()
    return result


class _Prompt:
    """One prompt, its cold prefill, and its checked restores: `ttft(load)` times a restore
    (`load(state)` -> (DynamicCache, tokens covered)) plus the suffix's prefill."""

    def __init__(self, model: Any, length: int) -> None:
        import torch

        self.model, self.length = model, length
        self.device = next(model.parameters()).device.type
        generator = torch.Generator().manual_seed(length)
        ids = torch.randint(0, model.config.vocab_size, (length,), generator=generator)
        self.tokens: list[int] = ids.tolist()
        self.ids = ids[None].to(self.device)  # (1, length)
        self.cold = self.forward(self.ids)  # also warms the allocator
        self.prefix = (length - 1) // PAGE_TOKENS * PAGE_TOKENS  # full pages of tokens[:-1]
        self.reference = self.cold.logits[0, -1].float()  # (vocab,)

    def forward(self, ids: Any, kv: Any = None) -> Any:
        import torch

        with torch.inference_mode():
            return self.model(ids, cache=kv, use_cache=True, logits_to_keep=1)

    def restored(self, load: Callable[[Any], tuple[Any, int]]) -> Callable[[Any], None]:
        def run(state: Any) -> None:
            kv, covered = load(state)
            if covered != self.prefix:
                raise RuntimeError(f"restored {covered} tokens of {self.prefix}")
            if self.device != "cpu":
                for layer in kv.layers:  # as HFBackend does: pages are assembled on the CPU
                    layer.keys, layer.values = (
                        layer.keys.to(self.device),
                        layer.values.to(self.device),
                    )
            logits = self.forward(self.ids[:, self.prefix :], kv).logits[0, -1].float()
            difference = float((logits - self.reference).abs().max())
            if difference > LOGIT_TOLERANCE[self.device]:
                raise RuntimeError(f"restored logits differ from cold by {difference}")

        return run

    def kept(self) -> Any:
        """The physical limit's state: the prefix's KV, never out of this process."""
        kv = copy.deepcopy(self.cold.cache)
        kv.crop(self.prefix - self.length)  # (transformers 5: a negative count removes tokens)
        return kv


def _one_length(
    model: Any, length: int, timer: _Timer, client: Any, workdir: Path
) -> dict[str, Any]:
    prompt = _Prompt(model, length)
    page_bytes = len(_first_page(prompt.cold.cache))
    tiers = _FilledTiers(prompt, page_bytes, client, workdir)
    head, config = prompt.tokens[:-1], model.config
    pages = prompt.prefix // PAGE_TOKENS

    def restore(cache: HybridCache, **chunks: int) -> tuple[Any, int]:
        return load_prefix(cache, TENANT, MODEL_ID, head, config, **chunks)

    ways = {
        "cold_ms": timer.median_ms(lambda _: prompt.forward(prompt.ids)),
        "in_process_ms": timer.median_ms(
            prompt.restored(lambda kv: (kv, prompt.prefix)), prepare=prompt.kept
        ),
        "memory_ms": timer.median_ms(prompt.restored(lambda _: restore(tiers.memory))),
        "ssd_ms": timer.median_ms(prompt.restored(lambda _: restore(tiers.ssd))),
        "redis_ms": timer.median_ms(prompt.restored(restore), prepare=tiers.restarted_node),
        "redis_one_batch_ms": timer.median_ms(
            prompt.restored(lambda node: restore(node, first_chunk=pages, max_chunk=pages)),
            prepare=tiers.restarted_node,
        ),
        "redis_chunks_of_two_ms": timer.median_ms(
            prompt.restored(lambda node: restore(node, first_chunk=2, max_chunk=2)),
            prepare=tiers.restarted_node,
        ),
        "redis_page_by_page_ms": timer.median_ms(
            prompt.restored(lambda node: _page_by_page(node, head, config)),
            prepare=tiers.restarted_node,
        ),
    }
    transport = {
        "mget_ms": timer.median_ms(lambda keys: _every_page(_mget(client, keys)), tiers.redis_keys),
        "get_by_get_ms": timer.median_ms(
            lambda keys: _every_page([client.get(key) for key in keys]), prepare=tiers.redis_keys
        ),
    }
    tiers.close()
    cold = ways["cold_ms"]
    return {
        **ways, "suffix_tokens": length - prompt.prefix,
        "ratio_to_cold": {
            name: round(ways[f"{name}_ms"] / cold, 4)
            for name in ("in_process", "memory", "ssd", "redis")
        },
        "batched_vs_page_by_page": round(ways["redis_page_by_page_ms"] / ways["redis_ms"], 2),
        "redis_transport": transport,
        "bytes_per_token": round(page_bytes / PAGE_TOKENS, 1),
    }  # fmt: skip


class _FilledTiers:
    """Every full page of a prompt in a memory tier alone, an SSD tier alone (what each
    restore costs with no faster tier above to serve part of it), and a Redis that
    `restarted_node` puts behind an empty memory and SSD tier: a node just restarted, the
    case warm-up and shared restores are for."""

    def __init__(self, prompt: _Prompt, page_bytes: int, client: Any, workdir: Path) -> None:
        self.pages = len(prompt.tokens) // PAGE_TOKENS
        self.room = 2 * (self.pages + 1) * page_bytes
        self.client, self.workdir = client, workdir
        client.flushdb()
        self.memory = HybridCache([MemoryTier(self.room)])
        self.ssd = HybridCache([SSDTier(workdir / "ssd", self.room)])
        self._nodes: list[HybridCache] = []
        self._redis = RedisTier(client, namespace="kv-bench")
        shared = HybridCache([self._redis])
        self._page_keys = page_keys(TENANT, MODEL_ID, prompt.tokens[:-1])
        for name, cache in (("memory", self.memory), ("ssd", self.ssd), ("redis", shared)):
            stored = store_prefix(cache, TENANT, MODEL_ID, prompt.tokens, prompt.cold.cache)
            if stored != self.pages:
                raise RuntimeError(f"the {name} tier stored {stored} pages of {self.pages}")

    def restarted_node(self) -> HybridCache:
        """A node cache as the gateway builds one, its memory and SSD empty."""
        for node in self._nodes:
            node.close()
        self._nodes = [HybridCache([
            MemoryTier(self.room),
            SSDTier(self.workdir / f"node-{time.monotonic_ns()}", self.room),
            RedisTier(self.client, namespace="kv-bench"),
        ], write_through=["memory", "redis"])]  # fmt: skip
        return self._nodes[0]

    def redis_keys(self) -> list[str]:
        """The Redis names of the prefix's pages, for the raw client's reads."""
        return [self._redis.redis_key(key.to_string()) for key in self._page_keys]

    def close(self) -> None:
        for cache in (self.memory, self.ssd, *self._nodes):
            cache.close()


def _mget(client: Any, keys: list[str]) -> list[bytes | None]:
    """The pages in MGETs of `MAX_CHUNK_PAGES` (the read-ahead's largest chunk): one reply of a
    whole 8,192-token prefix would be 600 MB, past the client's socket timeout."""
    return [
        v
        for at in range(0, len(keys), MAX_CHUNK_PAGES)
        for v in client.mget(keys[at : at + MAX_CHUNK_PAGES])
    ]


def _every_page(values: list[bytes | None]) -> None:
    """A transport read that missed a page timed less than the prefix: fail instead."""
    if not values or any(value is None for value in values):
        raise RuntimeError("the raw Redis read missed pages of the prefix")


def _first_page(kv: Any) -> bytes:
    """The first page's bytes as stored (what a tier moves per page)."""
    return encode_page(
        [(layer.keys[:, :, :PAGE_TOKENS], layer.values[:, :, :PAGE_TOKENS]) for layer in kv.layers]
    )

"""KV-cache pages: a prefix's attention keys/values stored as 16-token pages under prefix keys.

A page holds, for every layer, the keys and values of its 16 tokens — tensors shaped
(batch=1, heads, 16, head_dim) — serialised with safetensors (never pickle: a cache value must not
be able to run code when loaded). Page i is stored under the chained `PrefixKey` of blocks 0..i,
with page i-1 as its parent, so tiers keep chains prefix-closed and a page is only ever used
after all the pages before it.

`stream_prefix` yields pages one by one as they are fetched, so a caller can start on the first
pages (copy them to the GPU, start attention) before the last arrive; `load_prefix` assembles
the longest cached prefix into a transformers `DynamicCache`. torch and transformers are imported
lazily: the rest of the cache runtime does not need them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cache_runtime.keys import PrefixKey
from cache_runtime.policies import Hint
from cache_runtime.prefix_hash import BLOCK_TOKENS, token_blocks

if TYPE_CHECKING:
    import torch

    from cache_runtime.hybrid import HybridCache

PAGE_TOKENS = BLOCK_TOKENS


@dataclass(frozen=True)
class KVPage:
    """One page: per layer (keys, values), each (1, heads, PAGE_TOKENS, head_dim)."""

    key: PrefixKey
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def page_keys(tenant: str, model_id: str, tokens: Sequence[int]) -> list[PrefixKey]:
    """The prefix keys of a prompt's full 16-token pages (a partial tail has no page)."""
    return PrefixKey.chain(tenant, model_id, token_blocks(list(tokens), PAGE_TOKENS))


def encode_page(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> bytes:
    from safetensors.torch import save

    tensors = {}
    for i, (keys, values) in enumerate(layers):
        tensors[f"layer{i}.keys"] = keys.detach().contiguous().cpu()
        tensors[f"layer{i}.values"] = values.detach().contiguous().cpu()
    return save(tensors, metadata={"layers": str(len(layers)), "page_tokens": str(PAGE_TOKENS)})


def decode_page(data: bytes) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from safetensors.torch import load

    tensors = load(data)
    count = len(tensors) // 2
    return [(tensors[f"layer{i}.keys"], tensors[f"layer{i}.values"]) for i in range(count)]


def store_prefix(
    cache: HybridCache,
    tenant: str,
    model_id: str,
    tokens: Sequence[int],
    kv_cache: Any,
    turn: int | None = None,
    **put_options: Any,
) -> int:
    """Store the full pages of `tokens` from a transformers cache holding at least their KV.

    `turn`: the request's turn in its conversation, when the application knows it. From the
    second turn on, a conversation is live and its next turn reads these pages again, so they
    go in with `Hint.CONVERSATION` (measured by `preheat bench cache`: `preheat_app_hints`).
    Returns the number of pages stored; stops at the first page a tier refuses (a later page
    without it would be unusable).
    """
    if turn is not None and turn < 0:
        raise ValueError(f"turn must be >= 0, got {turn}")
    body_hint = Hint.CONVERSATION if turn else None
    stored = 0
    parent = None
    keys = page_keys(tenant, model_id, tokens)
    for index, key in enumerate(keys):
        start, end = index * PAGE_TOKENS, (index + 1) * PAGE_TOKENS
        # (1, heads, seq, head_dim) -> (1, heads, PAGE_TOKENS, head_dim) per layer
        layers = [
            (layer.keys[:, :, start:end], layer.values[:, :, start:end])
            for layer in kv_cache.layers
        ]
        hint = Hint.TAIL if index == len(keys) - 1 else body_hint  # the prompt's own last page
        if not cache.put(key, encode_page(layers), parent=parent, hint=hint, **put_options):
            break
        parent = key
        stored += 1
    return stored


def stream_prefix(
    cache: HybridCache, tenant: str, model_id: str, tokens: Sequence[int]
) -> Iterator[KVPage]:
    """Cached pages of `tokens` in order, each yielded as soon as it is fetched; ends at the
    first page not cached."""
    parent = None
    for key in page_keys(tenant, model_id, tokens):
        data = cache.get(key, parent=parent)  # a promoted page stays linked to its prefix
        if data is None:
            return
        yield KVPage(key, decode_page(data))
        parent = key


def load_prefix(
    cache: HybridCache, tenant: str, model_id: str, tokens: Sequence[int], config: Any
) -> tuple[Any, int]:
    """(DynamicCache of the longest cached prefix or None, number of tokens it covers)."""
    import torch
    from transformers import DynamicCache

    pages = list(stream_prefix(cache, tenant, model_id, tokens))
    if not pages:
        return None, 0
    per_layer = []
    for layer in range(len(pages[0].layers)):
        # n pages of (1, heads, PAGE_TOKENS, head_dim) -> (1, heads, n * PAGE_TOKENS, head_dim)
        keys = torch.cat([page.layers[layer][0] for page in pages], dim=2)
        values = torch.cat([page.layers[layer][1] for page in pages], dim=2)
        per_layer.append((keys, values))
    return DynamicCache(ddp_cache_data=per_layer, config=config), len(pages) * PAGE_TOKENS

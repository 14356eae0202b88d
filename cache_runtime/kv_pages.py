"""KV-cache pages: a prefix's attention keys/values stored as 16-token pages under prefix keys.

A page holds, for every layer, the keys and values of its 16 tokens — tensors shaped
(batch=1, heads, 16, head_dim) — serialised with safetensors (never pickle: a cache value must not
be able to run code when loaded). Page i is stored under the chained `PrefixKey` of blocks 0..i,
with page i-1 as its parent, so tiers keep chains prefix-closed and a page is only ever used
after all the pages before it.

`stream_prefix` reads a chain in chunks that double in size (2 pages, 4, 8, ... up to 64), each
chunk one call per tier (`HybridCache.get_chain`: a Redis MGET, one SQLite transaction), fetched
by a background thread that runs ahead of the caller: while the caller decodes and copies in
one chunk, the next is on the wire. The small first chunks start the caller early; the large
later ones keep the round trips few (7 for a 2,048-token prompt, where page by page was 128).
`load_prefix` copies the pages as they arrive into per-layer tensors allocated once, and hands
them to a transformers `DynamicCache`. Measured by `preheat bench kv` against page by page and
one single batch. torch and transformers are imported lazily: the rest of the cache runtime
does not need them.

A page is only ever a whole one: `store_prefix` stores the pages its KV cache covers in full, and
a fetched page that is not exactly `PAGE_TOKENS` tokens of the same layers and dtype as the first
(an undecodable, truncated or foreign value) ends the prefix there: counted in the cache's
`preheat_cache_errors{op="kv_page"}` and deleted, so the next prefill stores it whole again. A
DynamicCache built from it would claim positions it does not hold, and the model would attend
with misaligned positions: wrong logits, silently.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cache_runtime.keys import PrefixKey
from cache_runtime.policies import Hint
from cache_runtime.prefix_hash import PAGE_TOKENS, token_blocks

if TYPE_CHECKING:
    import torch

    from cache_runtime.hybrid import HybridCache

FIRST_CHUNK_PAGES = 2  # what the caller starts on
MAX_CHUNK_PAGES = 64  # 1,024 tokens a round trip: GPT-2 small's KV of it is 75 MB


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


def decode_page(
    data: bytes, like: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The layers of a page, each (keys, values) shaped (1, heads, PAGE_TOKENS, head_dim);
    given `like` (the first page of a prefix), of its model: same layers, dtype and shapes.

    Raises:
        ValueError: `data` is not a whole page: not safetensors, a layer missing or with keys
            or values of another shape, dtype or token count (`page_problem`).
    """
    from safetensors.torch import load

    try:
        tensors = load(data)
    except Exception as err:  # SafetensorError, or torch refusing a tensor: bytes, not a page
        raise ValueError(f"not a KV page: {err}") from err
    count = len(tensors) // 2
    names = {f"layer{i}.{part}" for i in range(count) for part in ("keys", "values")}
    if not count or set(tensors) != names:
        raise ValueError(f"not a KV page: tensors {sorted(tensors)[:4]}...")
    layers = [(tensors[f"layer{i}.keys"], tensors[f"layer{i}.values"]) for i in range(count)]
    problem = page_problem(layers, like)
    if problem:
        raise ValueError(problem)
    return layers


def page_problem(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
    like: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> str | None:
    """Why `layers` is not a whole page (of the same model as page `like`), or None.

    Whole: every keys and values tensor (1, heads, PAGE_TOKENS, head_dim), one dtype and,
    given `like`, its layer count, dtype and per-layer shapes. Concatenated with the pages
    around it, any other page would shift every position after it.
    """
    if like is not None and len(layers) != len(like):
        return f"{len(layers)} layers, the first page has {len(like)}"
    dtype = layers[0][0].dtype if like is None else like[0][0].dtype
    for i, (keys, values) in enumerate(layers):
        for tensor in (keys, values):
            if tensor.dim() != 4 or tensor.shape[0] != 1 or tensor.shape[2] != PAGE_TOKENS:
                return f"layer {i}: shape {tuple(tensor.shape)}, not (1, heads, {PAGE_TOKENS}, d)"
            if tensor.dtype != dtype:
                return f"layer {i}: dtype {tensor.dtype}, not {dtype}"
        if values.shape != keys.shape:
            return f"layer {i}: values {tuple(values.shape)} != keys {tuple(keys.shape)}"
        if like is not None and keys.shape != like[i][0].shape:
            return f"layer {i}: shape {tuple(keys.shape)}, first page {tuple(like[i][0].shape)}"
    return None


def store_prefix(
    cache: HybridCache,
    tenant: str,
    model_id: str,
    tokens: Sequence[int],
    kv_cache: Any,
    turn: int | None = None,
    session: str | None = None,
    first: int = 0,
    **put_options: Any,
) -> int:
    """Store the full pages of `tokens` from a transformers cache holding their KV.

    Only the pages `kv_cache` covers in full are stored: after `generate()` a cache holds one
    token fewer than prompt and output (the last token's KV is never computed), and a page
    sliced past its end would be stored short under the key of a whole one.

    `turn`: the request's turn in its conversation, when the application knows it. From the
    second turn on, a conversation is live and its next turn reads these pages again, so they
    go in with `Hint.CONVERSATION` (measured by `preheat bench cache`: `preheat_session_turn`).
    `session`: the conversation's id, when the application has one: the stored pages count as
    read by it, so that `cache.end_session(tenant, session)` can cool them.
    `first`: the first page to store, when the caller knows the ones before it are cached
    (rewriting them would cost a copy per page); the pages stored are `first..`.
    Returns the number of pages stored; stops at the first page a tier refuses (a later page
    without it would be unusable).
    """
    if turn is not None and turn < 0:
        raise ValueError(f"turn must be >= 0, got {turn}")
    if first < 0:
        raise ValueError(f"first must be >= 0, got {first}")
    body_hint = Hint.CONVERSATION if turn else None
    stored = 0
    keys = page_keys(tenant, model_id, tokens)
    parent = keys[first - 1] if 0 < first <= len(keys) else None
    for index in range(first, min(len(keys), covered_pages(kv_cache))):
        key = keys[index]
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
    if session is not None:
        written = keys[first : first + stored]
        cache.sessions.read(tenant, session, [key.to_string() for key in written])
    return stored


def covered_pages(kv_cache: Any) -> int:
    """Whole pages a transformers cache holds: its shortest layer's tokens // PAGE_TOKENS."""
    return min((_seq_length(layer) for layer in kv_cache.layers), default=0) // PAGE_TOKENS


def _seq_length(layer: Any) -> int:
    """Tokens held by one layer of a transformers cache (0 before its first update)."""
    keys = getattr(layer, "keys", None)
    return 0 if keys is None or keys.dim() < 3 else int(keys.shape[-2])


def stream_prefix(
    cache: HybridCache,
    tenant: str,
    model_id: str,
    tokens: Sequence[int],
    session: str | None = None,
    first_chunk: int = FIRST_CHUNK_PAGES,
    max_chunk: int = MAX_CHUNK_PAGES,
) -> Iterator[KVPage]:
    """Cached pages of `tokens` in order, read ahead in doubling chunks (see the module's
    docstring); ends at the first page not cached, or not whole: that one is counted in
    `cache.metrics.errors` under the tier that served it, op "kv_page", and treated as a miss.
    `session`: as in `store_prefix`; each page yielded counts as read by it."""
    if not 0 < first_chunk <= max_chunk:
        raise ValueError(f"need 0 < first_chunk <= max_chunk, got {first_chunk}, {max_chunk}")
    first: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    fetched = _read_ahead(cache, page_keys(tenant, model_id, tokens), first_chunk, max_chunk)
    try:
        for key, data, tier in fetched:
            try:
                layers = decode_page(data, like=first)
            except ValueError:
                cache.metrics.errors.labels(tier, "kv_page").inc()
                cache.delete(key)  # so the next prefill of this prefix stores it whole again
                return
            first = first or layers
            if session is not None:
                cache.sessions.read(tenant, session, [key.to_string()])
            yield KVPage(key, layers)
    finally:
        fetched.close()


def _read_ahead(
    cache: HybridCache, keys: list[PrefixKey], first_chunk: int, max_chunk: int
) -> Iterator[tuple[PrefixKey, bytes, str]]:
    """(key, value, tier) of the chain's cached pages, fetched by a thread that runs ahead.

    The queue is unbounded: everything fetched is part of the prefix the caller is reading,
    so running ahead costs no memory the restore would not use. A caller that stops early
    stops the thread at its next chunk."""
    arrived: queue.Queue[list[tuple[PrefixKey, bytes, str]] | BaseException | None] = queue.Queue()
    stop = threading.Event()

    def fetch() -> None:
        start, size, parent = 0, first_chunk, None
        try:
            while start < len(keys) and not stop.is_set():
                chunk = keys[start : start + size]
                pages = cache.get_chain(chunk, parent)
                arrived.put(
                    [(key, value, tier) for key, (value, tier) in zip(chunk, pages, strict=False)]
                )
                if len(pages) < len(chunk):
                    break
                start, size, parent = start + size, min(2 * size, max_chunk), chunk[-1]
        except BaseException as error:  # handed to the caller's thread, raised there
            arrived.put(error)
        finally:
            arrived.put(None)

    reader = threading.Thread(target=fetch, name="preheat-kv-read", daemon=True)
    reader.start()
    try:
        while (chunk := arrived.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            yield from chunk
    finally:
        stop.set()
        reader.join()


def load_prefix(
    cache: HybridCache,
    tenant: str,
    model_id: str,
    tokens: Sequence[int],
    config: Any,
    session: str | None = None,
    first_chunk: int = FIRST_CHUNK_PAGES,
    max_chunk: int = MAX_CHUNK_PAGES,
) -> tuple[Any, int]:
    """(DynamicCache of the longest cached prefix or None, number of tokens it covers).
    `session`, `first_chunk`, `max_chunk`: as in `stream_prefix`. Each page is copied, as it
    arrives, into per-layer tensors sized for the whole prompt: one copy, overlapped with the
    fetching of the next."""
    capacity = len(page_keys(tenant, model_id, tokens)) * PAGE_TOKENS
    per_layer: list[tuple[torch.Tensor, torch.Tensor]] = []
    filled = 0
    for page in stream_prefix(cache, tenant, model_id, tokens, session, first_chunk, max_chunk):
        if not per_layer:  # (1, heads, capacity, head_dim) per layer, like the first page
            per_layer = [
                (
                    keys.new_empty(_with_tokens(keys, capacity)),
                    values.new_empty(_with_tokens(values, capacity)),
                )
                for keys, values in page.layers
            ]
        for (keys, values), (new_keys, new_values) in zip(per_layer, page.layers, strict=True):
            keys[:, :, filled : filled + PAGE_TOKENS].copy_(new_keys)
            values[:, :, filled : filled + PAGE_TOKENS].copy_(new_values)
        filled += PAGE_TOKENS
    if not filled:
        return None, 0
    # views of the tokens the pages held: (1, heads, filled, head_dim)
    held = [(keys[:, :, :filled], values[:, :, :filled]) for keys, values in per_layer]
    return kv_cache_of(held, config), filled


def kv_cache_of(layers: Sequence[tuple[torch.Tensor, torch.Tensor]], config: Any) -> Any:
    """A transformers `DynamicCache` of `config`'s model that holds `layers` themselves.

    `DynamicCache(ddp_cache_data=layers)` concatenates each layer onto an empty tensor: one more
    copy of the whole prefix, which a restore does not need (its pages were already copied once,
    into tensors of their own). At 2,048 tokens of GPT-2 small that copy is 151 MB: 40-53 ms on
    the 2-core machine, most of a restore's load from memory. A layer of another kind than the plain
    `DynamicLayer` (a sliding window's) is filled through its own `update`, copy included, so
    that its bookkeeping stays right.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    if not cache.layers:  # a config without layer types: the cache makes its layers on first use
        cache.layers.extend(DynamicLayer() for _ in layers)
    if len(cache.layers) != len(layers):
        raise ValueError(f"{len(layers)} layers of KV for a model of {len(cache.layers)}")
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        if type(layer) is DynamicLayer:
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        else:
            layer.update(keys, values)
    return cache


def _with_tokens(tensor: torch.Tensor, tokens: int) -> tuple[int, ...]:
    """`tensor`'s shape (1, heads, PAGE_TOKENS, head_dim) with `tokens` in place of PAGE_TOKENS."""
    return (tensor.shape[0], tensor.shape[1], tokens, tensor.shape[3])

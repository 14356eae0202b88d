"""The bytes of a KV page: safetensors, read as views of the bytes rather than copies.

A page holds, for every layer, the keys and values of its 16 tokens, tensors shaped
(batch=1, heads, 16, head_dim), serialised with safetensors (never pickle: a cache value must not
be able to run code when loaded). `decode_page` checks a page whole (`page_problem`).

A restore copies each page once, into the prefix's per-layer tensors (`kv_pages.load_prefix`), so
decoding need not copy it before: `safetensors.torch.load` does (its `deserialize` hands each
tensor out as new bytes), which for 2,048 tokens of GPT-2 small (128 pages of 24 tensors) was
~27 ms of the restore's main thread on the 2-core machine. Hence the format's header is read
here, and checked as strictly as the library checks it; the tensors are views of the page.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cache_runtime.prefix_hash import PAGE_TOKENS

if TYPE_CHECKING:
    import torch

# safetensors' dtype names of the floating types a KV page can hold -> torch's
_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
# torch warns, once per process, that a view of bytes (read-only) is not writable: these views
# are only ever copied from
_READ_ONLY = "The given buffer is not writable"


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

    The tensors are read-only views of `data` (see the module docstring): copy one before
    writing to it.

    Raises:
        ValueError: `data` is not a whole page: not safetensors, a layer missing or with keys
            or values of another shape, dtype or token count (`page_problem`).
    """
    tensors = _safetensors_views(data)
    count = len(tensors) // 2
    names = {f"layer{i}.{part}" for i in range(count) for part in ("keys", "values")}
    if not count or set(tensors) != names:
        raise ValueError(f"not a KV page: tensors {sorted(tensors)[:4]}...")
    layers = [(tensors[f"layer{i}.keys"], tensors[f"layer{i}.values"]) for i in range(count)]
    problem = page_problem(layers, like)
    if problem:
        raise ValueError(problem)
    return layers


def _safetensors_views(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors buffer as views of it (the format: an 8-byte little-endian
    header size, a JSON header naming each tensor's dtype, shape and [begin, end) offsets in
    the data after it, then the data). Checked as the library checks: the header inside the
    buffer, a known dtype, offsets that tile the data in order with nothing left over, and
    each span exactly its shape's bytes; anything else is a ValueError."""
    import torch

    if sys.byteorder != "little":  # the data is little-endian: views would be wrong here
        from safetensors.torch import load

        try:
            return load(data)
        except Exception as err:  # SafetensorError, or torch refusing a tensor: not a page
            raise ValueError(f"not a KV page: {err}") from err
    try:
        start, spans = _tensor_spans(data)
        dtypes = {name: getattr(torch, _DTYPES[dtype]) for name, dtype, _, _ in spans}
    except (struct.error, UnicodeDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"not a KV page: {err}") from err
    tensors = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _READ_ONLY, UserWarning)
        for name, _, shape, begin in spans:
            dtype, count = dtypes[name], math.prod(shape)
            if not count:  # frombuffer refuses an empty view
                tensors[name] = torch.empty(shape, dtype=dtype)
                continue
            flat = torch.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
            tensors[name] = flat.view(shape)
    return tensors


def _tensor_spans(data: bytes) -> tuple[int, list[tuple[str, str, list[int], int]]]:
    """(where the data starts, [(name, dtype, shape, begin)] in data order) of a safetensors
    buffer, after checking its header (see `_safetensors_views`)."""
    (size,) = struct.unpack_from("<Q", data)
    if not 2 <= size <= len(data) - 8:
        raise ValueError(f"header of {size} bytes in a buffer of {len(data)}")
    header = json.loads(data[8 : 8 + size])
    if not isinstance(header, dict):
        raise ValueError("the header is not an object")
    header.pop("__metadata__", None)
    spans, filled = [], 0
    for name, spec in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        itemsize = _ITEMSIZE[spec["dtype"]]
        shape = [int(n) for n in spec["shape"]]
        begin, stop = (int(n) for n in spec["data_offsets"])
        if (
            begin != filled
            or any(n < 0 for n in shape)
            or stop - begin != math.prod(shape) * itemsize
        ):
            raise ValueError(f"{name}: data_offsets {begin}, {stop} do not tile the data")
        spans.append((name, spec["dtype"], shape, begin))
        filled = stop
    if filled != len(data) - 8 - size:
        raise ValueError(f"{len(data) - 8 - size - filled} bytes after the last tensor")
    return 8 + size, spans


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

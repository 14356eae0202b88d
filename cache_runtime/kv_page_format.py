"""The bytes of a KV page: safetensors, read as views of the bytes rather than copies.

A page holds, for every layer, the keys and values of its 16 tokens, tensors shaped
(batch=1, heads, 16, head_dim), serialised with safetensors (never pickle: a cache value must not
be able to run code when loaded). `decode_page` checks a page whole (`page_problem`).

A restore copies each page once, into the prefix's per-layer tensors (`kv_pages.load_prefix`), so
decoding need not copy it before: `safetensors.torch.load` does (its `deserialize` hands each
tensor out as new bytes), which for 2,048 tokens of GPT-2 small (128 pages of 24 tensors) was
~27 ms of the restore's main thread on the 2-core machine. Hence the format's header is read
here, and checked as strictly as the library checks it (`_tensor_spans`).

The tensors are views of the bytes a tier returned, which for the memory tier are the value it
keeps: never write to them (torch does not stop it), copy first.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import threading
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
_READ_ONLY = "The given buffer is not writable"  # torch's warning (`_consume_read_only_warning`)


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
    header size, a UTF-8 JSON header naming each tensor's dtype, shape and [begin, end) offsets
    in the data after it, then the data). The header is checked as the library checks it
    (`_tensor_spans`); anything else is a ValueError, whatever the header holds."""
    import torch

    if type(data) is not bytes:  # a view of a mutable buffer would change under the tensors
        data = bytes(data)
    if sys.byteorder != "little":  # the data is little-endian: views would be wrong here
        from safetensors.torch import load

        try:
            return load(data)
        except Exception as err:  # SafetensorError, or torch refusing a tensor: not a page
            raise ValueError(f"not a KV page: {err}") from err
    try:
        start, spans = _tensor_spans(data)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"not a KV page: {err}") from err
    _consume_read_only_warning()
    tensors = {}
    for name, dtype_name, shape, begin in spans:
        dtype, count = getattr(torch, _DTYPES[dtype_name]), math.prod(shape)
        if not count:  # frombuffer refuses an empty view
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = flat.view(shape)
    return tensors


def _tensor_spans(data: bytes) -> tuple[int, list[tuple[str, str, list[int], int]]]:
    """(where the data starts, [(name, dtype, shape, begin)] in data order) of a safetensors
    buffer. As the library requires: a header inside the buffer, in UTF-8, an object of tensors
    each with a known dtype, a shape of non-negative integers and two integer offsets, and
    string metadata; offsets that tile the data in order with nothing left over, each span its
    shape's bytes exactly. And each tensor aligned to its item size, as torch needs of a view.

    Raises:
        ValueError: any of these does not hold (the message says which).
    """
    (size,) = struct.unpack_from("<Q", data) if len(data) >= 8 else (0,)
    if not 2 <= size <= len(data) - 8:
        raise ValueError(f"header of {size} bytes in a buffer of {len(data)}")
    header = json.loads(data[8 : 8 + size].decode("utf-8"), parse_constant=_no_constant)
    if not isinstance(header, dict):
        raise ValueError("the header is not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(type(v) is str for v in metadata.values()):
        raise ValueError("__metadata__ is not an object of strings")
    start, found = 8 + size, []
    for name, spec in header.items():
        if not isinstance(spec, dict) or spec.get("dtype") not in _ITEMSIZE:
            raise ValueError(f"{name}: no known dtype")
        shape, offsets = spec.get("shape"), spec.get("data_offsets")
        if not _ints(shape, 0) or not _ints(offsets, 2):
            raise ValueError(f"{name}: shape {shape}, data_offsets {offsets}")
        found.append((offsets[0], offsets[1], name, spec["dtype"], shape))
    filled, spans = 0, []
    for begin, stop, name, dtype, shape in sorted(found):
        itemsize = _ITEMSIZE[dtype]
        if begin != filled or stop - begin != math.prod(shape) * itemsize:
            raise ValueError(f"{name}: data_offsets {begin}, {stop} do not tile the data")
        if (start + begin) % itemsize:
            raise ValueError(f"{name}: data at {start + begin}, not aligned to {itemsize} bytes")
        spans.append((name, dtype, shape, begin))
        filled = stop
    if filled != len(data) - start:
        raise ValueError(f"{len(data) - start - filled} bytes after the last tensor")
    return start, spans


def _ints(value: object, length: int) -> bool:
    """`value` is a list of non-negative ints (exactly `length` of them, unless 0)."""
    return (
        isinstance(value, list)
        and (not length or len(value) == length)
        and all(type(n) is int and n >= 0 for n in value)
    )


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} in the header")  # NaN and Infinity: JSON has no such numbers


_read_only_warned = threading.Event()
_warning_lock = threading.Lock()


def _consume_read_only_warning() -> None:
    """torch warns, once per process, that a view of bytes (read-only) is not writable; these
    views are only ever copied from. Warned here once, under a filter, so that no decode has to
    change the process's warning filters (not thread-safe) around its views."""
    if _read_only_warned.is_set():
        return
    import torch

    with _warning_lock:
        if not _read_only_warned.is_set():
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", _READ_ONLY, UserWarning)
                torch.frombuffer(b"\0\0\0\0", dtype=torch.uint8)
            _read_only_warned.set()


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

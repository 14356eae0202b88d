"""The KV page reader (`cache_runtime.kv_page_format`): the safetensors header read by hand, the
tensors as views of the page. It must read what the library reads, and refuse, with a ValueError,
every buffer the library refuses: a restore treats that error as the end of the cached prefix."""

from __future__ import annotations

import ctypes
import json
import struct

import pytest
import torch
from safetensors.torch import load

from cache_runtime.kv_page_format import decode_page, encode_page
from cache_runtime.prefix_hash import PAGE_TOKENS


def _page(dtype: torch.dtype = torch.float32, layers: int = 3) -> list[tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return [
        (torch.randn(1, 2, PAGE_TOKENS, 8).to(dtype), torch.randn(1, 2, PAGE_TOKENS, 8).to(dtype))
        for _ in range(layers)
    ]


def _with_header(data: bytes, edit) -> bytes:
    """`data` with its JSON header replaced by `edit(header)`, the tensors' bytes unchanged."""
    (size,) = struct.unpack_from("<Q", data)
    header = edit(json.loads(data[8 : 8 + size]))
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + size :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reads_what_the_library_reads_as_views_of_the_page(dtype: torch.dtype) -> None:
    data = encode_page(_page(dtype))
    layers = decode_page(data)
    expected = load(data)
    for i, (keys, values) in enumerate(layers):
        assert torch.equal(keys, expected[f"layer{i}.keys"])
        assert torch.equal(values, expected[f"layer{i}.values"])
    start, end = _address_range(data)
    assert all(start <= t.data_ptr() < end for pair in layers for t in pair)  # not copies


def _address_range(data: bytes) -> tuple[int, int]:
    """Where the bytes of `data` lie in memory (ctypes points into a bytes object, no copy)."""
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
    return address, address + len(data)


def _offsets_shifted(header: dict) -> dict:
    header["layer0.keys"]["data_offsets"][1] += 4  # one float more than its shape
    return header


def _unknown_dtype(header: dict) -> dict:
    header["layer1.values"]["dtype"] = "C64"
    return header


def _negative_shape(header: dict) -> dict:
    header["layer0.keys"]["shape"] = [-1, 2, PAGE_TOKENS, 8]
    return header


def _not_an_object(_: dict) -> list:
    return []


MALFORMED = {
    "empty": lambda data: b"",
    "size only": lambda data: data[:8],
    "header past the end": lambda data: struct.pack("<Q", len(data)) + data[8:],
    "header not json": lambda data: struct.pack("<Q", 4) + b"\xff\xfe{}" + data[12:],
    "truncated data": lambda data: data[:-4],
    "trailing bytes": lambda data: data + b"\0\0\0\0",
    "offsets do not tile": lambda data: _with_header(data, _offsets_shifted),
    "unknown dtype": lambda data: _with_header(data, _unknown_dtype),
    "negative shape": lambda data: _with_header(data, _negative_shape),
    "header not an object": lambda data: _with_header(data, _not_an_object),
}


@pytest.mark.parametrize("damage", sorted(MALFORMED))
def test_a_malformed_buffer_is_a_value_error_as_the_library_refuses_it(damage: str) -> None:
    bad = MALFORMED[damage](encode_page(_page()))
    with pytest.raises(ValueError, match="not a KV page"):
        decode_page(bad)
    with pytest.raises(Exception):  # noqa: B017 - the library's own error type, whichever
        load_and_check(bad)


def load_and_check(data: bytes) -> None:
    """The library's reading of `data`, and the same whole-page check `decode_page` makes."""
    tensors = load(data)
    if any(t.shape != (1, 2, PAGE_TOKENS, 8) for t in tensors.values()):
        raise ValueError("not a page of this shape")

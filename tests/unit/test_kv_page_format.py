"""The KV page reader (`cache_runtime.kv_page_format`): the safetensors header read by hand, the
tensors as views of the page. It must read what the library reads, and refuse, with a ValueError,
every buffer the library refuses: a restore treats that error as the end of the cached prefix."""

from __future__ import annotations

import ctypes
import json
import struct
from collections.abc import Callable

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load

from cache_runtime.kv_page_format import decode_page, encode_page
from cache_runtime.prefix_hash import PAGE_TOKENS


def _page(
    dtype: torch.dtype = torch.float32, layers: int = 3
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        (torch.randn(1, 2, PAGE_TOKENS, 8).to(dtype), torch.randn(1, 2, PAGE_TOKENS, 8).to(dtype))
        for _ in range(layers)
    ]


def _with_header(data: bytes, edit: Callable[[dict], object]) -> bytes:
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


def _set(name: str, field: str, value: object) -> Callable[[dict], dict]:
    def edit(header: dict) -> dict:
        header[name][field] = value
        return header

    return edit


def _deeply_nested(data: bytes) -> bytes:
    text = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    return struct.pack("<Q", len(text)) + text + data[8 + struct.unpack_from("<Q", data)[0] :]


def _misaligned(data: bytes) -> bytes:
    """The header one byte longer (a space), so that every tensor starts one byte off."""
    (size,) = struct.unpack_from("<Q", data)
    return struct.pack("<Q", size + 1) + data[8 : 8 + size] + b" " + data[8 + size :]


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
    "infinite offset": lambda data: _with_header(
        data, _set("layer0.keys", "data_offsets", [0, float("inf")])
    ),
    "no offsets": lambda data: _with_header(data, _set("layer0.keys", "data_offsets", [])),
    "float in shape": lambda data: _with_header(
        data, _set("layer0.keys", "shape", [1.0, 2, PAGE_TOKENS, 8])
    ),
    "bool in shape": lambda data: _with_header(
        data, _set("layer0.keys", "shape", [True, 2, PAGE_TOKENS, 8])
    ),
    "metadata not strings": lambda data: _with_header(
        data, lambda header: {**header, "__metadata__": {"layers": 3}}
    ),
    "deeply nested header": _deeply_nested,
    "misaligned data": _misaligned,
}


@pytest.mark.parametrize("damage", sorted(MALFORMED))
def test_a_malformed_buffer_is_a_value_error_as_the_library_refuses_it(damage: str) -> None:
    bad = MALFORMED[damage](encode_page(_page()))
    with pytest.raises(ValueError, match="not a KV page"):
        decode_page(bad)
    if damage != "misaligned data":  # the library copies, so alignment is not its concern
        with pytest.raises(SafetensorError):
            load(bad)


def test_a_bytearray_is_read_as_bytes_so_later_writes_do_not_reach_the_tensors() -> None:
    mutable = bytearray(encode_page(_page()))
    layers = decode_page(mutable)
    before = layers[0][0].clone()
    mutable[-4:] = b"\xff\xff\xff\xff"
    mutable[200:216] = bytes(16)
    assert torch.equal(layers[0][0], before)

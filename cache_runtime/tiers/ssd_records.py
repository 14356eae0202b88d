"""The SSD tier's record format: a checksum over a write id and the value, so that a torn or
bit-flipped record is never served (`unpack` returns None) and a record can be told apart from
another write's of the same key (see `ssd.py`: the index row names the write it vouches for).

    record = BLAKE2b-128(write id + value) | write id (8 bytes, big-endian) | value
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import BinaryIO

CHECKSUM_BYTES = 16
WRITE_ID = struct.Struct(">q")  # after the checksum, which covers it
HEADER_BYTES = CHECKSUM_BYTES + WRITE_ID.size


def _checksum(body: bytes | memoryview) -> bytes:
    return hashlib.blake2b(body, digest_size=CHECKSUM_BYTES).digest()


def new_write_id() -> int:
    """Random, not a counter: processes write unsynchronised ids, and a collision (2**-63) is
    the only way a record could pass for another write's."""
    return WRITE_ID.unpack(os.urandom(WRITE_ID.size))[0]


def pack(write_id: int, value: bytes) -> bytes:
    body = WRITE_ID.pack(write_id) + value
    return _checksum(body) + body


def unpack(stored: object) -> tuple[int, bytes] | None:
    """(write id, value) of an intact record; None when it is not one (torn, bit-flipped, or
    written by a version without write ids)."""
    if not isinstance(stored, bytes) or len(stored) < HEADER_BYTES:
        return None
    if _checksum(memoryview(stored)[CHECKSUM_BYTES:]) != stored[:CHECKSUM_BYTES]:
        return None
    return WRITE_ID.unpack_from(stored, CHECKSUM_BYTES)[0], stored[HEADER_BYTES:]


def write_id_of(head: bytes) -> int | None:
    """The write id in a record's first `HEADER_BYTES` (unchecked: the value is not read);
    None if the record is shorter than its header."""
    if len(head) < HEADER_BYTES:
        return None
    return WRITE_ID.unpack_from(head, CHECKSUM_BYTES)[0]


def head_of(stored: bytes | BinaryIO) -> bytes:
    """The first `HEADER_BYTES` of a record as diskcache reads it with `read=True`: bytes for
    a value kept inside its SQLite file, an open file for one kept as a file (read that far
    only, then closed)."""
    if isinstance(stored, bytes):
        return stored[:HEADER_BYTES]
    with stored:
        return stored.read(HEADER_BYTES)

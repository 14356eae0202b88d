"""Access traces for cache replay: object ids in order, grouped into requests.

Formats: `mooncake` (each request's 512-token prefix blocks, in order: one access per block),
`lirs` (one block number per line), `cache2k` (big-endian int32 keys, read as unsigned) and
`oracle` (libCacheSim oracleGeneral binary, uint64 ids). Only Mooncake has requests of several
blocks; in the others every access is its own request, and prefix hits equal block hits.

Any of them may come compressed with gzip, xz or zstd, told by the file's first bytes rather than
its name: the LIRS traces ship as gzip, cache2k's as xz, and libCacheSim's public oracleGeneral
traces as zstd (`.oracleGeneral.zst`, which libCacheSim reads without decompressing first).
Read by its name alone, a zstd file was taken for raw records: "not an oracleGeneral trace", or,
when its size happened to be a multiple of 24 bytes, ids that were compressed bytes.
"""

from __future__ import annotations

import gzip
import lzma
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import zstandard

from cache_runtime.prefix_hash import PAGE_TOKENS

ORACLE_DTYPE = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
TRACE_FORMATS = ("mooncake", "lirs", "cache2k", "oracle")
MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """The trace cannot be read in the given format."""


@dataclass(frozen=True)
class AccessTrace:
    name: str
    accesses: np.ndarray  # (N,) int64 object ids, in access order
    request_starts: np.ndarray  # (R,) int64 index of each request's first access
    times: np.ndarray | None = None  # (N,) float64 seconds of each access, where the trace has them
    tokens: np.ndarray | None = None  # (N,) int64 prompt tokens in each block, where known
    # (N,) int64 priority (1..10) of the request each access belongs to, where the source has one
    # (the lake's requests do; Mooncake and key-value traces do not)
    priorities: np.ndarray | None = None

    @property
    def unique(self) -> int:
        return len(np.unique(self.accesses))

    def last_requests(self, count: int) -> AccessTrace:
        """The most recent `count` requests as a trace of their own (the tuner's window)."""
        if count >= len(self.request_starts):
            return self
        first = int(self.request_starts[-count])
        return AccessTrace(
            f"{self.name}[last {count} requests]",
            self.accesses[first:],
            self.request_starts[-count:] - first,
            None if self.times is None else self.times[first:],
            None if self.tokens is None else self.tokens[first:],
            None if self.priorities is None else self.priorities[first:],
        )


# the magic numbers that open a gzip member, an xz stream and a zstd frame (RFC 1952, the xz
# file format 1.0.4, RFC 8878)
GZIP_MAGIC, XZ_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd"


def _zstd(data: bytes) -> bytes:
    """Every frame of a zstd file, whether or not its header gives the content size (a
    streaming compressor, as `zstd` on a pipe, leaves it out; one-shot `decompress` refuses).
    Frame by frame, because a stream reader returns what it has of a truncated file without a
    word: a trace cut short must fail, not replay its first part."""
    parts = []
    while data:
        frame = zstandard.ZstdDecompressor().decompressobj()
        parts.append(frame.decompress(data))
        if not frame.eof:
            raise EOFError("zstd stream ends inside a frame (truncated file)")
        data = frame.unused_data
    return b"".join(parts)


def _open(path: Path) -> bytes:
    data = path.read_bytes()
    if data.startswith(GZIP_MAGIC):
        return gzip.decompress(data)
    if data.startswith(XZ_MAGIC):
        return lzma.decompress(data)
    if data.startswith(ZSTD_MAGIC):
        return _zstd(data)
    return data


def load_trace(path: Path, fmt: str) -> AccessTrace:
    if fmt not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; choose one of {', '.join(TRACE_FORMATS)}")
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        data = _open(path)
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as err:
        raise TraceError(f"{path}: cannot decompress ({err})") from None
    if fmt == "mooncake":
        return _mooncake(path, data)
    if fmt == "lirs":
        ids = _lirs_keys(path, data)
    elif fmt == "cache2k":
        if len(data) % 4:
            raise TraceError(
                f"{path}: {len(data)} bytes is not a whole number of 4-byte keys "
                "(cache2k traces are big-endian int32 keys)"
            )
        # cache2k writes Java ints: a hashed key is negative half the time. Read as unsigned,
        # the same keys stay distinct and every id is one libCacheSim's uint64 accepts.
        ids = np.frombuffer(data, dtype=">u4").astype(np.int64)
    else:
        if len(data) % ORACLE_DTYPE.itemsize:
            raise TraceError(
                f"{path}: {len(data)} bytes is not a whole number of 24-byte records "
                "(an oracleGeneral trace)"
            )
        # uint64 ids above 2**63 keep their bits as negative int64 (`unsigned_id` undoes it)
        ids = np.frombuffer(data, dtype=ORACLE_DTYPE)["id"].view(np.int64).copy()
    if not len(ids):
        raise TraceError(f"{path}: empty trace")
    return AccessTrace(path.name, ids, np.arange(len(ids), dtype=np.int64))


def _lirs_keys(path: Path, data: bytes) -> np.ndarray:
    """(N,) int64 keys of a LIRS trace: one non-negative block number per line. Blank lines
    and `*` lines (separators in some of the LIRS paper's traces, e.g. `cs` and `2_pools`: they
    name no block) are skipped. A bad line is named with its number."""
    keys = []
    for number, line in enumerate(data.splitlines(), start=1):
        text = line.strip()
        if not text or text == b"*":
            continue
        try:
            key = int(text)
        except ValueError:
            shown = text[:20].decode(errors="replace")
            raise TraceError(
                f"{path}: line {number} is {shown!r}: lirs traces hold one integer key per line"
            ) from None
        if not 0 <= key < 1 << 63:
            raise TraceError(f"{path}: line {number}: key {key} is not a block number (0..2^63)")
        keys.append(key)
    return np.array(keys, dtype=np.int64)


def unsigned_id(access: int) -> int:
    """The uint64 object id of an access id (the int64 bits of an oracleGeneral id >= 2**63
    are negative here): what libCacheSim's requests take."""
    return access % (1 << 64)


def load_request_keys(
    path: Path, fmt: str = "mooncake", prefix_blocks: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    """Each request's time and key, for hot-set prediction (`models.forecast.hotset`).

    A request's key is its prefix of the first `prefix_blocks` blocks, named by the block id at
    its end: Mooncake's hash ids are chained, so `hash_ids[min(4, n) - 1]` identifies the whole
    prefix and two requests share a key exactly when they share those blocks. Requests without
    hash_ids are skipped (as in `load_trace`).

    Returns:
        times (R,) float64 seconds and keys (R,) int64, in file order.

    Raises:
        TraceError: unreadable input, or a format whose records carry no timestamps (a hot set
            is per time window, so access order alone cannot define one).
    """
    if prefix_blocks < 1:
        raise ValueError("prefix_blocks must be at least 1")
    trace = load_trace(path, fmt)
    if trace.times is None:
        raise TraceError(f"{path}: {fmt} traces carry no timestamps; hot sets need them")
    starts = trace.request_starts
    ends = np.append(starts[1:], len(trace.accesses))
    last_block = starts + np.minimum(prefix_blocks, ends - starts) - 1
    return trace.times[starts], trace.accesses[last_block]


def _mooncake(path: Path, data: bytes) -> AccessTrace:
    blocks: list[int] = []
    starts: list[int] = []
    seconds: list[float] = []
    tokens: list[int] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            ids, stamp_ms = record["hash_ids"], float(record["timestamp"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise TraceError(f"{path}:{number}: not a Mooncake record with hash_ids") from None
        if ids:
            starts.append(len(blocks))
            blocks.extend(ids)
            seconds.extend([stamp_ms / 1000.0] * len(ids))
            tokens.extend(_block_tokens(len(ids), record.get("input_length")))
    if not blocks:
        raise TraceError(f"{path}: no blocks")
    return AccessTrace(
        path.name,
        np.array(blocks, dtype=np.int64),
        np.array(starts, dtype=np.int64),
        np.array(seconds, dtype=np.float64),
        np.array(tokens, dtype=np.int64),
    )


def _block_tokens(blocks: int, input_length: object) -> list[int]:
    """Tokens in each of a request's blocks: full blocks of 512, the rest in the last one."""
    full = [MOONCAKE_BLOCK_TOKENS] * blocks
    if isinstance(input_length, int) and not isinstance(input_length, bool) and input_length > 0:
        rest = input_length - MOONCAKE_BLOCK_TOKENS * (blocks - 1)
        full[-1] = int(min(max(rest, 1), MOONCAKE_BLOCK_TOKENS))
    return full


def write_oracle(trace: AccessTrace, path: Path) -> None:
    """The trace as oracleGeneral records (time = access index, unit size, next access index or
    -1), which libCacheSim's Belady needs: without it Belady is silently wrong (DESIGN.md)."""
    n = len(trace.accesses)
    next_index = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((np.arange(n), trace.accesses))  # by id, then position
    same = trace.accesses[order[1:]] == trace.accesses[order[:-1]]
    next_index[order[:-1][same]] = order[1:][same]
    records = np.zeros(n, dtype=ORACLE_DTYPE)
    records["time"] = np.arange(n)
    records["id"] = trace.accesses.astype(np.int64).view(np.uint64)  # negative: their bits
    records["size"] = 1
    records["next"] = next_index
    records.tofile(path)


def trace_from_requests(requests: pd.DataFrame, name: str = "lake") -> AccessTrace:
    """`RequestLog` rows (timestamp, prefix_hashes, prompt_tokens, and priority when the frame
    has that column) as a trace of KV pages, each page carrying its request's priority.

    The platform hashes 16-token pages (`cache_runtime.prefix_hash`), chained, so a page id names
    its whole prefix exactly as Mooncake's block ids do; requests without hashes are skipped.
    """
    rows = requests.dropna(subset=["prefix_hashes"]).sort_values("timestamp", kind="stable")
    if rows.empty:
        raise TraceError(f"{name}: no requests with prefix hashes")
    pages = [np.asarray(h, dtype=np.int64) for h in rows["prefix_hashes"].tolist()]
    lengths = np.array([len(p) for p in pages])
    seconds = rows["timestamp"].astype("int64").to_numpy() / 1e9
    tokens = np.full(int(lengths.sum()), PAGE_TOKENS, dtype=np.int64)
    ends = np.cumsum(lengths) - 1
    rest = rows["prompt_tokens"].to_numpy(dtype=np.int64) - PAGE_TOKENS * (lengths - 1)
    tokens[ends] = np.clip(rest, 1, PAGE_TOKENS)
    priorities = None
    if "priority" in rows.columns:
        priorities = np.repeat(rows["priority"].to_numpy(dtype=np.int64), lengths)
    return AccessTrace(
        name,
        np.concatenate(pages),
        np.concatenate([[0], ends[:-1] + 1]).astype(np.int64),
        np.repeat(seconds, lengths),
        tokens,
        priorities,
    )

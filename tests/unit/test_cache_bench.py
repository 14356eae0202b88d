"""The cache replay harness: our LRU equals libCacheSim's, prefix hits, trace formats, Belady."""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

import numpy as np
import orjson
import pytest
import zstandard

from cache_runtime.policies import LRUPolicy
from cache_runtime.pool import PoolPolicy
from cache_runtime.prefix_policies import PrefixARC, PrefixSLRU
from cache_runtime.simulator import prefix_hits, replay
from cache_runtime.traces import ORACLE_DTYPE, AccessTrace, TraceError, load_trace, write_oracle
from models.evaluation.bench.cache_bench import (
    LIBCACHESIM_POLICIES,
    MORE_LIBCACHESIM_POLICIES,
    bench_cache,
    libcachesim_hits,
)


def random_trace(n: int = 4000, seed: int = 0) -> AccessTrace:
    rng = np.random.default_rng(seed)
    ids = rng.zipf(1.3, n).astype(np.int64) % 500
    starts = np.sort(rng.choice(np.arange(1, n), size=n // 8, replace=False))
    return AccessTrace("random", ids, np.concatenate([[0], starts]).astype(np.int64))


def test_own_arc_without_hints_tracks_libcachesim_arc(tmp_path: Path) -> None:
    trace = random_trace(20_000, seed=4)
    write_oracle(trace, tmp_path / "t.oracle")
    ours = replay(PrefixARC(tail_cold=False), trace.accesses, trace.request_starts, 60, hints=False)
    theirs = libcachesim_hits("ARC", trace, 60, tmp_path / "t.oracle")
    assert abs(ours.mean() - theirs.mean()) < 0.01


def test_the_pool_follows_the_better_member() -> None:
    """A scan-heavy workload with a small hot set: whichever member does better leads."""
    rng = np.random.default_rng(5)
    hot = rng.integers(0, 40, 30_000)
    scan = np.arange(100_000, 130_000)
    accesses = np.empty(60_000, dtype=np.int64)
    accesses[0::2], accesses[1::2] = hot, scan
    trace = AccessTrace("mixed", accesses, np.arange(len(accesses)))
    duel = PoolPolicy(("arc", "slru"))
    hits = replay(duel, trace.accesses, trace.request_starts, 100, hints=False).mean()
    members = [
        replay(p, trace.accesses, trace.request_starts, 100, hints=False).mean()
        for p in (PrefixARC(), PrefixSLRU())
    ]
    assert hits >= min(members) and hits >= 0.9 * max(members)


def test_own_lru_replay_matches_libcachesim_lru_access_by_access(tmp_path: Path) -> None:
    trace = random_trace()
    ours = replay(LRUPolicy(), trace.accesses, trace.request_starts, 50, hints=False)
    write_oracle(trace, tmp_path / "t.oracle")
    theirs = libcachesim_hits("LRU", trace, 50, tmp_path / "t.oracle")
    assert np.array_equal(ours, theirs)


def test_belady_is_an_upper_bound(tmp_path: Path) -> None:
    trace = random_trace(seed=1)
    write_oracle(trace, tmp_path / "t.oracle")
    belady = libcachesim_hits("Belady", trace, 50, tmp_path / "t.oracle").mean()
    for name in ("LRU", "ARC", "S3FIFO", "Sieve"):
        assert libcachesim_hits(name, trace, 50, tmp_path / "t.oracle").mean() <= belady
    assert replay(PrefixSLRU(), trace.accesses, trace.request_starts, 50).mean() <= belady


def test_oracle_file_has_next_access_indices(tmp_path: Path) -> None:
    trace = AccessTrace("t", np.array([5, 6, 5, 7, 6, 5]), np.arange(6))
    write_oracle(trace, tmp_path / "t.oracle")
    records = np.fromfile(tmp_path / "t.oracle", dtype=ORACLE_DTYPE)
    assert records["next"].tolist() == [2, 4, 5, -1, -1, -1]
    assert records["id"].tolist() == [5, 6, 5, 7, 6, 5]


def test_prefix_hits_need_every_earlier_block_of_the_request() -> None:
    hits = np.array([True, False, True, True, True, True, False])
    starts = np.array([0, 3, 5])
    assert prefix_hits(hits, starts).tolist() == [True, False, False, True, True, True, False]


def test_trace_formats(tmp_path: Path) -> None:
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_bytes(
        b"\n".join(orjson.dumps({"timestamp": i, "hash_ids": [0, 1, i + 2]}) for i in range(3))
    )
    trace = load_trace(mooncake, "mooncake")
    assert trace.accesses.tolist() == [
        0,
        1,
        2,
        0,
        1,
        3,
        0,
        1,
        4,
    ] and trace.request_starts.tolist() == [0, 3, 6]
    lirs = tmp_path / "x.trace.gz"
    lirs.write_bytes(gzip.compress(b"1\n2\n*\n1\n"))  # `*`: a separator, no access
    assert load_trace(lirs, "lirs").accesses.tolist() == [1, 2, 1]
    cache2k = tmp_path / "w.trace.xz"
    cache2k.write_bytes(lzma.compress(np.array([7, 8, 7], dtype=">i4").tobytes()))
    assert load_trace(cache2k, "cache2k").accesses.tolist() == [7, 8, 7]
    write_oracle(trace, tmp_path / "o.bin")
    assert load_trace(tmp_path / "o.bin", "oracle").accesses.tolist() == trace.accesses.tolist()


def _zstd_frames(data: bytes, frames: int) -> bytes:
    """`data` as `frames` zstd frames written by a streaming compressor, as `zstd` on a pipe
    writes them: no content size in the headers."""
    step = -(-len(data) // frames)
    out = b""
    for start in range(0, len(data), step):
        stream = zstandard.ZstdCompressor().compressobj()
        out += stream.compress(data[start : start + step]) + stream.flush()
    return out


def test_compressed_traces_are_told_by_their_bytes_not_their_names(tmp_path: Path) -> None:
    """libCacheSim's public oracleGeneral traces come as `.zst`; a compressed file read as raw
    records would replay its compressed bytes as ids."""
    trace = AccessTrace("t", np.array([3, -1, 3, 2**40, 7, 3], dtype=np.int64), np.arange(6))
    write_oracle(trace, tmp_path / "t.bin")
    packed = _zstd_frames((tmp_path / "t.bin").read_bytes(), frames=2)
    for name in ("t.oracleGeneral.zst", "t.oracleGeneral"):  # with and without the suffix
        (tmp_path / name).write_bytes(packed)
        assert load_trace(tmp_path / name, "oracle").accesses.tolist() == trace.accesses.tolist()
    (tmp_path / "x.txt").write_bytes(gzip.compress(b"4\n5\n4\n"))
    assert load_trace(tmp_path / "x.txt", "lirs").accesses.tolist() == [4, 5, 4]
    (tmp_path / "w.bin").write_bytes(lzma.compress(np.array([-2, 9], dtype=">i4").tobytes()))
    assert load_trace(tmp_path / "w.bin", "cache2k").accesses.tolist() == [2**32 - 2, 9]


def test_a_truncated_zstd_trace_is_refused_not_replayed_in_part(tmp_path: Path) -> None:
    write_oracle(AccessTrace("t", np.arange(500, dtype=np.int64), np.arange(500)), tmp_path / "o")
    packed = _zstd_frames((tmp_path / "o").read_bytes(), frames=3)
    (tmp_path / "cut.zst").write_bytes(packed[:-7])  # the last frame loses its end
    with pytest.raises(TraceError, match=r"cannot decompress.*truncated"):
        load_trace(tmp_path / "cut.zst", "oracle")


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        (b"not json", "mooncake", "not a Mooncake record"),
        (b"1\nx\n", "lirs", "line 2 is 'x': lirs traces hold one integer key per line"),
        (b"1\n\n-3\n", "lirs", "line 3: key -3 is not a block number"),
        (b"1\n\xff\xfe\n", "lirs", "line 2 is"),
        (b"12345", "cache2k", "5 bytes is not a whole number of 4-byte keys"),
        (b"x" * 25, "oracle", "25 bytes is not a whole number of 24-byte records"),
        (b"", "lirs", "empty trace"),
        (b"1", "parquet", "unknown trace format"),
    ],
)
def test_bad_traces_are_rejected_with_a_reason(
    tmp_path: Path, content: bytes, fmt: str, message: str
) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        load_trace(path, fmt)


def test_negative_and_huge_ids_are_read_as_their_writers_meant_and_replayed(
    tmp_path: Path,
) -> None:
    """cache2k's Java ints are negative for half the hashed keys; oracleGeneral ids are uint64:
    both reach libCacheSim as valid, distinct object ids, and `bench cache` runs on them."""
    rng = np.random.default_rng(4)
    java_ints = rng.integers(-(2**31), 2**31, 60, dtype=np.int64)[rng.zipf(1.3, 3000) % 60]
    cache2k = tmp_path / "negative.trace.xz"
    cache2k.write_bytes(lzma.compress(java_ints.astype(">i4").tobytes()))

    trace = load_trace(cache2k, "cache2k")

    assert (trace.accesses >= 0).all() and trace.accesses.max() < 2**32
    assert trace.accesses.tolist() == (java_ints % 2**32).tolist()  # distinct stay distinct
    result = bench_cache(trace, [0.2])
    row = result["sizes"]["0.2"]
    assert 0 < row["LRU"] <= row["Belady"]

    huge = AccessTrace("u64", np.array([-1, 5, -1, -(2**63), 5], dtype=np.int64), np.arange(5))
    write_oracle(huge, tmp_path / "huge.bin")
    records = np.fromfile(tmp_path / "huge.bin", dtype=ORACLE_DTYPE)
    assert records["id"].tolist() == [2**64 - 1, 5, 2**64 - 1, 2**63, 5]
    again = load_trace(tmp_path / "huge.bin", "oracle")
    assert again.accesses.tolist() == huge.accesses.tolist()
    hits = libcachesim_hits("LRU", again, 3, tmp_path / "huge.bin")
    assert hits.tolist() == [False, False, True, False, True]


@pytest.mark.slow
def test_bench_cache_output_shape() -> None:
    result = bench_cache(random_trace(2000, seed=2), [0.05, 0.2])
    assert set(result) >= {
        "trace",
        "requests",
        "unique",
        "infinite_hit_ratio",
        "req_per_s",
        "lru_req_per_s",
        "sizes",
    }
    assert result["lru_req_per_s"] > 0 and result["req_per_s"] > 0
    for row in result["sizes"].values():
        for name in ("preheat", "LRU", "ARC", "S3FIFO", "Sieve", "WTinyLFU", "Belady"):
            assert 0 <= row[name] <= row["Belady"] + 1e-9 or name == "Belady"
            assert row[f"{name}_prefix"] <= row[name] + 1e-9
        assert row["LRU"] == row["preheat_lru"]  # one policy, two places
        online = (*LIBCACHESIM_POLICIES, *MORE_LIBCACHESIM_POLICIES)
        assert row["best_online"] == max(row[name] for name in online)
        assert row[row["best_online_policy"]] == row["best_online"]
        assert row["best_online_prefix"] == max(row[f"{name}_prefix"] for name in online)


def test_tail_hints_only_apply_to_multi_block_requests() -> None:
    rng = np.random.default_rng(6)
    ids = rng.zipf(1.2, 5000).astype(np.int64) % 700
    one_per_request = AccessTrace("kv", ids, np.arange(len(ids)))
    with_hints = replay(PrefixSLRU(), ids, one_per_request.request_starts, 80, hints=True)
    without = replay(PrefixSLRU(), ids, one_per_request.request_starts, 80, hints=False)
    assert np.array_equal(with_hints, without)


def test_a_cache_too_small_for_libcachesim_is_refused_not_aborted() -> None:
    """libCacheSim's S3-FIFO kills the process below 10 entries: refuse with the reason."""
    with pytest.raises(ValueError, match="at least 10"):
        bench_cache(random_trace(2000, seed=2), [0.01])

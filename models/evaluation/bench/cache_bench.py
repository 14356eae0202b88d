"""`preheat bench cache`: the memory tier's policies next to libCacheSim's on one trace.

Every policy sees the same accesses at the same capacities (a fraction of the unique objects,
unit sizes). Block hit ratio counts every hit; prefix hit ratio counts a block only when every
block before it in its request hit too — what a KV prefix cache can actually use. Belady is the
offline optimum (it reads the future from an oracleGeneral file); the others are online.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cache_runtime.policies import LRUPolicy
from cache_runtime.pool import PoolPolicy
from cache_runtime.prefix_policies import PrefixARC, PrefixSLRU
from cache_runtime.simulator import AppHints, prefix_hits, replay, replay_with_app_hints
from cache_runtime.traces import AccessTrace, unsigned_id, write_oracle
from models.evaluation.bench.conversations import (
    Conversations,
    EndedCall,
    app_hints,
    ended_after,
    find_conversations,
)

LIBCACHESIM_POLICIES = ("LRU", "ARC", "S3FIFO", "Sieve", "WTinyLFU")
# More of libCacheSim's online policies, classic and learned, run beside the list so that
# `best_online` is the best of all of them. Left out: LRB and 3L-Cache, which learn from request
# times and object sizes (with unit sizes and no clock they replay as LRU here, equal to four
# decimals), and ClockPro, whose libCacheSim build hits 0.03 where LRU hits 0.26 (broken).
MORE_LIBCACHESIM_POLICIES = (
    "MQ", "TwoQ", "LIRS", "Hyperbolic", "Cacheus", "LeCaR", "LHD", "GLCache",
)  # fmt: skip
# libCacheSim's S3-FIFO gives 10% to its small queue and aborts the process (not an exception)
# when that rounds to zero entries
MIN_BENCH_CAPACITY = 10


class CacheSizeError(ValueError):
    """A cache size too small for a peer policy (checked before any replay)."""


def parse_sizes(sizes: str) -> list[float]:
    """`0.01,0.1`: cache sizes as fractions of the unique objects, each in (0, 1]; a
    ValueError saying what is wrong otherwise (`preheat bench cache`, `tier_policy.py`)."""
    try:
        values = [float(part) for part in sizes.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--sizes {sizes!r}: expected comma-separated fractions like 0.01,0.1"
        ) from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValueError(f"--sizes {sizes!r}: every fraction must be in (0, 1]")
    return values


def libcachesim_hits(name: str, trace: AccessTrace, capacity: int, oracle: Path) -> np.ndarray:
    """(N,) bool: which accesses hit in libCacheSim's `name` policy (LRU, ARC, S3FIFO, Sieve,
    WTinyLFU, Belady) of `capacity` objects; `oracle`: the trace as an oracleGeneral file
    (`write_oracle`), which Belady reads for each object's next access."""
    import libcachesim as lcs

    cache = getattr(lcs, name)(cache_size=capacity)
    hits = np.zeros(len(trace.accesses), dtype=bool)
    if name == "Belady":
        reader = lcs.TraceReader(str(oracle), lcs.TraceType.ORACLE_GENERAL_TRACE)
        for i, request in enumerate(reader):
            hits[i] = cache.get(request)
        return hits
    request = lcs.Request()
    request.obj_size = 1
    get = cache.get
    for i, obj in enumerate(trace.accesses.tolist()):
        request.obj_id = obj if obj >= 0 else unsigned_id(obj)
        hits[i] = get(request)
    return hits


def _ratios(hits: np.ndarray, trace: AccessTrace) -> tuple[float, float]:
    return (
        round(float(hits.mean()), 4),
        round(float(prefix_hits(hits, trace.request_starts).mean()), 4),
    )


def bench_cache(
    trace: AccessTrace, sizes: list[float], progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The JSON object of `preheat bench cache` (see the issue for its fields)."""
    unique = trace.unique
    capacities = _capacities(unique, sizes)
    result = _trace_summary(trace, unique)
    app: dict[str, AppHints] = {}
    if len(trace.request_starts) < len(trace.accesses):  # requests of several blocks: prompts
        conversations = find_conversations(trace)
        app = application_hints(trace, conversations)
        result["conversations"] = {
            "count": conversations.count,
            "follow_up_requests": conversations.follow_ups,
            "idle_timeout_s": IDLE_TIMEOUT_S,
            "reading_s": READING_S,
        }
    replayed, replay_seconds, lru_seconds = 0, 0.0, 0.0
    with tempfile.TemporaryDirectory() as work:
        oracle = Path(work) / "trace.oracleGeneral"
        write_oracle(trace, oracle)
        for fraction, capacity in capacities.items():
            row: dict[str, Any] = {"capacity": capacity}
            pool_s, lru_s = _own_policies(row, trace, capacity, app)
            replay_seconds, lru_seconds = replay_seconds + pool_s, lru_seconds + lru_s
            replayed += len(trace.accesses)
            _peer_policies(row, trace, capacity, oracle, f"size {fraction}", progress)
            _best_online(row)
            _gaps_closed(row)
            result["sizes"][str(fraction)] = row
    result["req_per_s"] = round(replayed / replay_seconds, 1) if replay_seconds else None
    # the same simulator replaying our LRU alone, in the same run: the machine's yardstick, so
    # that the pool's speed can be read as a ratio on a machine of any speed
    result["lru_req_per_s"] = round(replayed / lru_seconds, 1) if lru_seconds else None
    return result


# The causal "conversation ended" calls (`conversations.EndedCall`): a 5-minute idle timeout, and
# an explicit close 30 s (a user reading the last answer) after the conversation's last request.
IDLE_TIMEOUT_S = 300.0
READING_S = 30.0
HINT_COLUMNS = ("session_turn", "idle_end", "explicit_close", "hindsight_end")


def application_hints(trace: AccessTrace, conversations: Conversations) -> dict[str, AppHints]:
    """Column suffix -> what an application tells the cache: session and turn only; with an
    idle-timeout end or an explicit close (both need the trace's times); with the end in
    hindsight (an upper bound: no application knows a turn is the last when it is served)."""
    hints = {"session_turn": AppHints(app_hints(trace, conversations, {}).conversation, {})}
    if trace.times is not None:
        for name, call, wait in (
            ("idle_end", EndedCall.IDLE_TIMEOUT, IDLE_TIMEOUT_S),
            ("explicit_close", EndedCall.EXPLICIT_CLOSE, READING_S),
        ):
            ended = ended_after(trace, conversations, call, wait)
            hints[name] = app_hints(trace, conversations, ended)
    hints["hindsight_end"] = app_hints(trace, conversations)
    return hints


def _capacities(unique: int, sizes: list[float]) -> dict[float, int]:
    """fraction -> capacity in objects, all checked before any replay: fail fast, whole."""
    capacities = {fraction: round(fraction * unique) for fraction in sizes}
    for fraction, capacity in capacities.items():
        if capacity < MIN_BENCH_CAPACITY:
            raise CacheSizeError(
                f"size {fraction} of {unique} unique objects is {capacity} entries; "
                f"libCacheSim's S3-FIFO needs at least {MIN_BENCH_CAPACITY} (it aborts below)"
            )
    return capacities


def _trace_summary(trace: AccessTrace, unique: int) -> dict[str, Any]:
    """The result's head: what the trace holds, and the hit ratio of an infinite cache."""
    return {
        "trace": trace.name,
        "requests": len(trace.request_starts),
        "accesses": len(trace.accesses),
        "unique": unique,
        "infinite_hit_ratio": round(1 - unique / len(trace.accesses), 4),
        "sizes": {},
    }


def _own_policies(
    row: dict[str, Any], trace: AccessTrace, capacity: int, app: dict[str, AppHints]
) -> tuple[float, float]:
    """The memory tier's policies into `row`: the pool with and without hints (and with each of
    the application's, when the trace has conversations), the prefix policies alone, our LRU.
    Returns the seconds of the pool's hinted replay (the one `req_per_s` measures) and of our
    LRU's (`lru_req_per_s`)."""
    started = time.perf_counter()
    ours = replay(PoolPolicy(capacity=capacity), trace.accesses, trace.request_starts, capacity)
    seconds = time.perf_counter() - started
    row["preheat"], row["preheat_prefix"] = _ratios(ours, trace)
    no_hints = replay(
        PoolPolicy(capacity=capacity),
        trace.accesses, trace.request_starts, capacity, hints=False,
    )  # fmt: skip
    row["preheat_no_hints"], row["preheat_no_hints_prefix"] = _ratios(no_hints, trace)
    for name, hints in app.items():  # the application's session, turn and "ended" hints on top
        with_app = replay_with_app_hints(
            PoolPolicy(capacity=capacity),
            trace.accesses, trace.request_starts, capacity, hints,
        )  # fmt: skip
        row[f"preheat_{name}"], row[f"preheat_{name}_prefix"] = _ratios(with_app, trace)
    for name, policy in (("prefix_slru", PrefixSLRU()), ("prefix_arc", PrefixARC())):
        hits = replay(policy, trace.accesses, trace.request_starts, capacity)
        row[name], row[f"{name}_prefix"] = _ratios(hits, trace)
    started = time.perf_counter()
    own_lru = replay(LRUPolicy(), trace.accesses, trace.request_starts, capacity)
    lru_seconds = time.perf_counter() - started
    row["preheat_lru"], _ = _ratios(own_lru, trace)
    return seconds, lru_seconds


def _peer_policies(
    row: dict[str, Any],
    trace: AccessTrace,
    capacity: int,
    oracle: Path,
    label: str,
    progress: Callable[[str], None] | None,
) -> None:
    """libCacheSim's policies into `row`, online ones first, then Belady (reading `oracle`);
    `progress` hears `label` and each policy's name before its replay."""
    for name in (*LIBCACHESIM_POLICIES, *MORE_LIBCACHESIM_POLICIES, "Belady"):
        if progress:
            progress(f"{label}: {name}")
        hits = libcachesim_hits(name, trace, capacity, oracle)
        row[name], row[f"{name}_prefix"] = _ratios(hits, trace)


def _best_online(row: dict[str, Any]) -> None:
    """The best of libCacheSim's online policies, by block hit ratio and by prefix hit ratio
    (each its own best: the two need not be one policy)."""
    online = {n: row[n] for n in (*LIBCACHESIM_POLICIES, *MORE_LIBCACHESIM_POLICIES)}
    row["best_online_policy"] = max(online, key=online.__getitem__)
    row["best_online"] = online[row["best_online_policy"]]
    row["best_online_prefix"] = max(row[f"{n}_prefix"] for n in online)


def _gaps_closed(row: dict[str, Any]) -> None:
    """How much of the gap between LRU and Belady each of our pool's replays in `row` closes
    (0 when there is no gap)."""
    gap = row["Belady"] - row["LRU"]
    for hints in ("", "_no_hints", *(f"_{name}" for name in HINT_COLUMNS)):
        if f"preheat{hints}" in row:
            closed = (row[f"preheat{hints}"] - row["LRU"]) / gap if gap > 0 else 0.0
            row[f"gap_closed{hints}_vs_lru"] = round(closed, 4)

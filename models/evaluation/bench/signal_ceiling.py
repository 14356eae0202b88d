"""How much of the LRU-to-Belady gap the trace's own signals can close, measured in hindsight.

Issue 3 sets a goal for the eviction policy: close about a fifth of the gap from LRU to Belady at
10% of unique blocks from signals in the trace itself — how many turns a conversation has had,
the time since a block was last used, a request's last block being almost never reused. This
measures what those signals are worth on a given trace at most: eviction by class-conditioned
reuse probability, whose statistics are fitted on the whole trace in hindsight.

- A block's class, fixed at each access: the turn of the conversation of the accessing request
  (`find_conversations`, which uses only earlier requests), how many times the block has been
  accessed (1, 2, 3-5, 6+), and whether it is its request's last block.
- Its age: accesses since that access.
- The table, per class and age bin: P(next use within the next `window` accesses | no use in
  the first `age`), from every access's true next-use distance (the hindsight part).
- Eviction: of `samples` random residents, the one least likely to be used within the window.

Each decision sees only a resident's class and age, never its own future, so this bounds what
an online policy using the same signals can do if it learned their statistics perfectly; it is
a measurement, not a policy to ship (an online learner must estimate the table from the past,
and on the shipped Mooncake trace the past is a poor guide: its reuse gaps shrink as it runs).
"""

from __future__ import annotations

import bisect
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cache_runtime.pool import PoolPolicy
from cache_runtime.simulator import replay
from cache_runtime.traces import AccessTrace, write_oracle
from models.evaluation.bench.cache_bench import libcachesim_hits
from models.evaluation.bench.conversations import find_conversations

NEVER = np.iinfo(np.int64).max  # next-use distance of an access whose object never returns
TURN_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7)  # turn >= each bound: the 8th and later turns share one
COUNT_BUCKETS = (1, 2, 3, 6)  # accessed once, twice, 3 to 5 times, 6 times or more


def next_use_distances(accesses: np.ndarray) -> np.ndarray:
    """(N,) int64: accesses until the same object is accessed again; NEVER if it is not."""
    distances = np.full(len(accesses), NEVER, dtype=np.int64)
    following: dict[int, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        obj = int(accesses[i])
        if obj in following:
            distances[i] = following[obj] - i
        following[obj] = i
    return distances


def access_classes(trace: AccessTrace, use_turns: bool) -> np.ndarray:
    """(N,) int64 class of each access: (turn bucket, access-count bucket, last block)."""
    n = len(trace.accesses)
    lengths = np.diff(np.append(trace.request_starts, n))
    request_of = np.repeat(np.arange(len(lengths)), lengths)
    last_block = np.zeros(n, dtype=np.int64)
    if len(lengths) < n:  # requests of several blocks: "a request's last block" means something
        last_block[np.append(trace.request_starts[1:], n) - 1] = 1
    turn_bucket = np.zeros(n, dtype=np.int64)
    if use_turns and len(lengths) < n:
        turns = find_conversations(trace).turn[request_of]
        turn_bucket = np.searchsorted(TURN_BUCKETS, turns, side="right") - 1
    seen: dict[int, int] = {}
    counts = np.empty(n, dtype=np.int64)
    for i, obj in enumerate(trace.accesses.tolist()):
        seen[obj] = counts[i] = seen.get(obj, 0) + 1
    count_bucket = np.searchsorted(COUNT_BUCKETS, counts, side="right") - 1
    return (turn_bucket * len(COUNT_BUCKETS) + count_bucket) * 2 + last_block


def age_edges(longest: int) -> list[int]:
    """Lower edges of the age bins: quarter octaves from 1 (age 0 is its own bin)."""
    edges = {0, *np.unique(np.round(2 ** (np.arange(0, np.log2(max(longest, 2)) * 4 + 1) / 4)))}
    return sorted(int(e) for e in edges)


def reuse_table(
    classes: np.ndarray, distances: np.ndarray, window: int, edges: list[int]
) -> np.ndarray:
    """(classes, bins) P(a < d <= a + window | d > a) at each bin's lower edge a; 0 for a
    class-age pair no access reached."""
    table = np.zeros((int(classes.max()) + 1, len(edges)))
    ages = np.asarray(edges, dtype=np.int64)
    for cls in np.unique(classes):
        d = np.sort(distances[classes == cls])
        survived = len(d) - np.searchsorted(d, ages, side="right")
        reused = np.searchsorted(d, ages + window, side="right") - (len(d) - survived)
        table[cls] = np.where(survived > 0, reused / np.maximum(survived, 1), 0.0)
    return table


def replay_by_table(
    trace: AccessTrace,
    classes: np.ndarray,
    table: np.ndarray,
    edges: list[int],
    capacity: int,
    samples: int = 32,
    seed: int = 0,
) -> np.ndarray:
    """(N,) hit mask of sampled eviction by `table` (see the module docstring)."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    rng = np.random.default_rng(seed)
    draws = iter(rng.integers(0, 1 << 62, size=(len(trace.accesses) + 1) * samples).tolist())
    keys = trace.accesses.tolist()
    cls_of = classes.tolist()
    rows = table.tolist()
    last = len(edges) - 1
    hits = np.zeros(len(keys), dtype=bool)
    state: dict[int, tuple[int, int]] = {}  # resident -> (last access, class then)
    residents: list[int] = []
    slot: dict[int, int] = {}
    for i, obj in enumerate(keys):
        if obj in state:
            hits[i] = True
        else:
            if len(residents) >= capacity:
                worst, worst_score = residents[0], 2.0
                for _ in range(samples):
                    candidate = residents[next(draws) % len(residents)]
                    at, cls = state[candidate]
                    age_bin = min(bisect.bisect_right(edges, i - at) - 1, last)
                    if rows[cls][age_bin] < worst_score:
                        worst, worst_score = candidate, rows[cls][age_bin]
                del state[worst]
                moved = residents.pop()
                if moved != worst:
                    residents[slot[worst]] = moved
                    slot[moved] = slot[worst]
                del slot[worst]
            slot[obj] = len(residents)
            residents.append(obj)
        state[obj] = (i, cls_of[i])
    return hits


def bench_ceiling(trace: AccessTrace, sizes: list[float], samples: int = 32) -> dict[str, Any]:
    """Per size: LRU, Belady and the shipped policy (libCacheSim and `replay`, as
    `preheat bench cache`), the hindsight ceiling with and without conversation turns, and the
    share of the LRU-to-Belady gap each closes."""
    unique = trace.unique
    distances = next_use_distances(trace.accesses)
    variants = {
        "ceiling_turns": access_classes(trace, use_turns=True),
        "ceiling_no_turns": access_classes(trace, use_turns=False),
    }
    result: dict[str, Any] = {"trace": trace.name, "accesses": len(trace.accesses), "sizes": {}}
    with tempfile.TemporaryDirectory() as work:
        oracle = Path(work) / "trace.oracleGeneral"
        write_oracle(trace, oracle)
        edges = age_edges(len(trace.accesses))
        for fraction in sizes:
            capacity = max(1, round(fraction * unique))
            row: dict[str, float] = {"capacity": capacity}
            for name in ("LRU", "Belady"):
                row[name] = round(float(libcachesim_hits(name, trace, capacity, oracle).mean()), 4)
            ours = replay(
                PoolPolicy(capacity=capacity), trace.accesses, trace.request_starts, capacity
            )
            row["preheat"] = round(float(ours.mean()), 4)
            for name, classes in variants.items():
                table = reuse_table(classes, distances, capacity, edges)
                hits = replay_by_table(trace, classes, table, edges, capacity, samples)
                row[name] = round(float(hits.mean()), 4)
            gap = row["Belady"] - row["LRU"]
            for name in ("preheat", *variants):
                closed = (row[name] - row["LRU"]) / gap if gap > 0 else 0.0
                row[f"{name}_gap_closed"] = round(closed, 4)
            result["sizes"][str(fraction)] = row
    return result

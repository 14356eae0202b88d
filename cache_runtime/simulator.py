"""Replay an access trace through a policy object: the same code the memory tier runs.

Objects have unit size here (a KV page or a trace block each), so capacity is a number of
entries. `prefix_hits` turns per-access hits into what a KV prefix cache can use: within one
request, a block only counts once every block before it hit too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from cache_runtime.policies import EvictionPolicy, Hint, Key, keep_nothing


def replay(
    policy: EvictionPolicy,
    accesses: np.ndarray,
    request_starts: np.ndarray,
    capacity: int,
    hints: bool = True,
    times: np.ndarray | None = None,
    priorities: np.ndarray | None = None,
) -> np.ndarray:
    """Per-access hit mask. `accesses`: (N,) int64 object ids in order; `request_starts`:
    (R,) index of each request's first access. With `hints`, each request's last block is
    inserted with `Hint.TAIL` — only for traces whose requests have several blocks: where every
    access is its own request (key-value traces), "last block of the prompt" means nothing.
    `times`: (N,) seconds of each access for time-aware policies; else the access index.
    `priorities`: (N,) priority (1..10) of the request each access belongs to, for policies
    that weigh accesses by it (`HeatPolicy`): then each access goes to the policy's
    `on_insert_priority` / `on_access_priority` with its priority. An argument per access rather
    than a "current priority" set on the policy before each call: no hidden state to forget, and
    the memory tier can pass a request's priority the same way. None (the default) runs the
    loop exactly as before, so policies without priorities pay nothing for them."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    n = len(accesses)
    if priorities is not None:
        if not hasattr(policy, "on_access_priority"):
            raise ValueError(f"policy {policy.name!r} does not weigh accesses by priority")
        if np.shape(priorities) != (n,):
            raise ValueError(f"priorities must have shape ({n},), got {np.shape(priorities)}")
    tails = _request_tails(request_starts, n) if hints else np.zeros(n, dtype=bool)
    resident: set[int] = set()
    keys = accesses.tolist()
    clock = times.tolist() if times is not None else [float(i) for i in range(n)]
    if priorities is not None:
        weights = np.asarray(priorities).tolist()
        return _replay_priorities(policy, keys, clock, tails, capacity, weights)
    on_access, on_insert, on_remove, victim = (
        policy.on_access, policy.on_insert, policy.on_remove, policy.victim,
    )  # fmt: skip
    keep: Callable[[Key], bool] = keep_nothing
    # plain lists in the loop, not numpy items: indexing a numpy array per access cost about
    # a tenth of a microsecond each, beside a pool's 5 per access on cs
    hint_of = [Hint.TAIL if tail else None for tail in tails.tolist()]
    hit_at: list[int] = []
    for i, obj in enumerate(keys):
        key = obj  # ints are valid dict keys; policies treat keys as opaque
        if obj in resident:
            hit_at.append(i)
            on_access(key, clock[i])
            continue
        if len(resident) >= capacity:
            gone = victim(keep)
            on_remove(gone)
            resident.discard(gone)
        on_insert(key, clock[i], hint_of[i])
        resident.add(obj)
    hits = np.zeros(n, dtype=bool)
    hits[hit_at] = True
    return hits


def _request_tails(request_starts: np.ndarray, n: int) -> np.ndarray:
    """(n,) True at each request's last access — only for traces whose requests have several
    accesses: where every access is its own request, "last block of the prompt" means nothing."""
    tails = np.zeros(n, dtype=bool)
    if 0 < len(request_starts) < n:
        tails[np.append(request_starts[1:], n) - 1] = True
    return tails


def _replay_priorities(
    policy: EvictionPolicy,
    keys: list[int],
    clock: list[float],
    tails: np.ndarray,
    capacity: int,
    priority: list[float],
) -> np.ndarray:
    """`replay`'s loop with each access's priority (a copy, so the plain loop stays as fast)."""
    hits = np.zeros(len(keys), dtype=bool)
    resident: set[int] = set()
    on_access = policy.on_access_priority  # type: ignore[attr-defined]
    on_insert = policy.on_insert_priority  # type: ignore[attr-defined]
    on_remove, victim = policy.on_remove, policy.victim
    for i, obj in enumerate(keys):
        if obj in resident:
            hits[i] = True
            on_access(obj, clock[i], priority[i])
            continue
        if len(resident) >= capacity:
            gone = victim(keep_nothing)
            on_remove(gone)
            resident.discard(gone)
        on_insert(obj, clock[i], Hint.TAIL if tails[i] else None, priority[i])
        resident.add(obj)
    return hits


@dataclass(frozen=True)
class AppHints:
    """What a serving application tells the cache beyond the trace, per access.

    `conversation`: (N,) bool, the access belongs to a conversation past its first turn that
    has not ended (inserted with `Hint.CONVERSATION`). `cool_after`: access index -> keys the
    application declares cold right after that access ("conversation ended": its own blocks go
    first, `EvictionPolicy.on_cold`)."""

    conversation: np.ndarray
    cool_after: Mapping[int, list[int]]


def replay_with_app_hints(
    policy: EvictionPolicy,
    accesses: np.ndarray,
    request_starts: np.ndarray,
    capacity: int,
    app: AppHints,
) -> np.ndarray:
    """`replay` with the tail hint plus the application's conversation hints (a copy of its
    loop, so that the plain replay pays nothing for them)."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    n = len(accesses)
    if np.shape(app.conversation) != (n,):
        raise ValueError(f"conversation must have shape ({n},), got {np.shape(app.conversation)}")
    tails = _request_tails(request_starts, n)
    inserted_as = np.where(tails, Hint.TAIL, np.where(app.conversation, Hint.CONVERSATION, ""))
    hint_of = [h or None for h in inserted_as.tolist()]
    hits = np.zeros(n, dtype=bool)
    resident: set[int] = set()
    cool_after = app.cool_after
    for i, obj in enumerate(accesses.tolist()):
        if obj in resident:
            hits[i] = True
            policy.on_access(obj, float(i))
        else:
            if len(resident) >= capacity:
                gone = policy.victim(keep_nothing)
                policy.on_remove(gone)
                resident.discard(gone)
            policy.on_insert(obj, float(i), hint_of[i])
            resident.add(obj)
        if i in cool_after:
            for key in cool_after[i]:
                if key in resident:
                    policy.on_cold(key)
    return hits


def prefix_hits(hits: np.ndarray, request_starts: np.ndarray) -> np.ndarray:
    """Hits that a prefix cache can use: leading runs of hits within each request."""
    n = len(hits)
    request_of = np.zeros(n, dtype=np.int64)
    request_of[request_starts[1:]] = 1
    request_of = np.cumsum(request_of)
    misses_so_far = np.cumsum(~hits)
    # misses before each request's start, broadcast to its accesses
    before = np.concatenate([[0], misses_so_far])[request_starts][request_of]
    return hits & (misses_so_far - before == 0)

"""The prefill queue of the replay: k servers, FIFO, chunked prefill; TTFT and utilisation.

A pure function of the requests (arrival time, milliseconds of KV loads, prompt tokens left to
prefill) and the engine (servers, tokens per millisecond, chunk size), so every arm of a
comparison is priced by the same engine, and the queue is tested on its own.

The engine is a vLLM / Sarathi-Serve style prefill scheduler on each of `servers` GPUs, fed
from one FIFO queue (a router sending each request to the first engine that takes new work):

- a server runs iterations of at most `chunk_tokens` prompt tokens; an iteration lasts its
  tokens / rate, plus the KV loads of the requests that start in it (loaded before the forward
  pass that uses them);
- each iteration first continues the request the server left unfinished, then takes new
  requests from the head of the queue (arrived by the iteration's start) until the budget is
  spent: chunks of one request stay on one server (its KV lives there) and run in order;
- a request's first token comes at the end of the iteration holding its last prompt token;
  with nothing queued the server idles until the next arrival.

What chunking changes against per-request FIFO: the order of completions is the same (the head
request's chunks go first), but an iteration that finishes one request packs the next ones'
first chunks in, so a short request behind nothing can still wait for a partner's chunk to end
(up to `chunk_tokens` / rate, ~51 ms at the reference engine) — the price of not stalling
decodes, which this model does not see (it prices TTFT only). With `chunk_tokens=1` the queue
is exactly the textbook k-server FIFO queue (M/D/1 with one server and fixed service, which the
tests check against Pollaczek-Khinchine).

Rejected: queueing time as a formula (M/G/k approximations): restarts make the load
non-stationary (a cold node gets a burst of long prefills), which is what the replay measures.
Not modelled: warm-up work on the same servers — the replay's warm-up worker has its own
modelled compute (`warming.WarmWorker`), so a warm-up never delays a request here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueueResult:
    """Per request (R,) first-token times; per iteration (I,) busy intervals of the servers."""

    done_ms: np.ndarray  # (R,) when each request's first token is out (trace ms)
    busy_start_ms: np.ndarray  # (I,) start of each busy stretch of a server
    busy_end_ms: np.ndarray  # (I,) its end
    servers: int

    def utilisation(self, windows_ms: list[tuple[float, float]] | None = None) -> float:
        """Busy server time / (servers x time), over `windows_ms` ((start, end) pairs, not
        overlapping), or from the first busy moment to the last (None)."""
        if not len(self.busy_start_ms):
            return 0.0
        if windows_ms is None:
            windows_ms = [(float(self.busy_start_ms.min()), float(self.busy_end_ms.max()))]
        busy = total = 0.0
        for low, high in windows_ms:
            overlap = np.minimum(self.busy_end_ms, high) - np.maximum(self.busy_start_ms, low)
            busy += float(np.clip(overlap, 0.0, None).sum())
            total += max(high - low, 0.0)
        return float(busy / (self.servers * total)) if total > 0 else 0.0


def simulate_queue(
    arrival_ms: np.ndarray,
    load_ms: np.ndarray,
    tokens: np.ndarray,
    servers: int,
    ms_per_token: float,
    chunk_tokens: int,
) -> QueueResult:
    """Run the FIFO chunked-prefill queue (see the module docstring) over requests (R,) in
    arrival order: `arrival_ms`, `load_ms` of their cached blocks, `tokens` left to prefill."""
    if servers < 1 or chunk_tokens < 1 or ms_per_token < 0:
        raise ValueError("servers and chunk_tokens must be >= 1, ms_per_token >= 0")
    if len(arrival_ms) > 1 and np.any(np.diff(arrival_ms) < 0):
        raise ValueError("requests must come in arrival order")
    arrivals, loads = arrival_ms.astype(float).tolist(), load_ms.astype(float).tolist()
    left = np.asarray(tokens, dtype=np.int64).tolist()
    done = [0.0] * len(arrivals)
    starts: list[float] = []
    ends: list[float] = []
    carried: list[int | None] = [None] * servers  # the request each server left unfinished
    free = [(0.0, s) for s in range(servers)]  # (time the server is free, server), a heap
    head = 0  # next request not yet taken by a server
    while head < len(arrivals) or any(r is not None for r in carried):
        now, server = heapq.heappop(free)
        own = carried[server]
        if own is None and head < len(arrivals) and arrivals[head] > now:
            heapq.heappush(free, (arrivals[head], server))  # idle until the next arrival
            continue
        if own is None and head >= len(arrivals):
            continue  # nothing left for this server: it retires
        end, head, carried[server] = _iteration(
            now, own, head, arrivals, loads, left, done, ms_per_token, chunk_tokens
        )
        starts.append(now)
        ends.append(end)
        heapq.heappush(free, (end, server))
    return QueueResult(np.array(done), np.array(starts), np.array(ends), servers)


def _iteration(
    now: float, own: int | None, head: int, arrivals: list[float], loads: list[float],
    left: list[int], done: list[float], ms_per_token: float, chunk: int,
) -> tuple[float, int, int | None]:  # fmt: skip
    """One busy stretch of a server from `now`: (its end, the new queue head, the request it
    leaves unfinished). Iterations that hold only one request's chunks are run as one stretch
    (nothing else can join them), so a long prompt costs one step, not one per chunk."""
    if own is not None and left[own] > chunk:
        # full iterations of `own` alone, up to the one holding its last chunk
        full = (left[own] - 1) // chunk
        left[own] -= full * chunk
        return now + full * chunk * ms_per_token, head, own
    budget, extra_ms, batch = chunk, 0.0, []
    if own is not None:
        budget -= left[own]
        batch.append(own)
        left[own] = 0
    unfinished = None
    while budget > 0 and head < len(arrivals) and arrivals[head] <= now:
        request = head
        head += 1
        extra_ms += loads[request]
        take = min(left[request], budget)
        budget -= take
        left[request] -= take
        if left[request]:
            unfinished = request  # the budget ran out inside it: it carries over
        else:
            batch.append(request)
    end = now + extra_ms + (chunk - budget) * ms_per_token
    for request in batch:
        done[request] = end
    return end, head, unfinished

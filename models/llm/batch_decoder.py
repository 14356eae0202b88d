"""One model, many requests: one thread runs every forward pass and decodes all sequences together.

Why: a model in this process serves several tenants at once, and one tenant's flood of long
generations must not make another's short request slow. Work goes in order of priority:
requests that have decoded fewer tokens first (a multi-level feedback queue over the tokens a
request has attained, a level per doubling past `QUANTUM_TOKENS`, as FastServe does: Wu et al.,
"Fast Distributed Inference Serving for Large Language Models", 2023), then, within a level,
the tenant that has used the model least lately (`TenantUsage`), then the oldest request. A
short request thus never queues behind a long one's remaining tokens, and among requests of
one size the tenants share the model. Each round of the decoder thread:
1. runs at most one waiting forward job (a request's prefill), the first in priority;
2. seats the sequences that decode this round: at most `rows` of them, first in priority; the
   others stand, their KV set aside, until a seat is theirs;
3. picks each seated sequence's next token from its logits (greedy, or sampled with its own
   generator), hands it to the sequence's reader and drops the sequences that ended (end of
   sequence, their `max_tokens`, or a reader that stopped reading);
4. advances the others by one token in one forward pass, and charges its time to their tenants.

`rows` by device (`default_rows`): on a GPU a row costs little next to the step, and every
request decoding rides in one forward pass. On a CPU each row costs a large share of the step
(measured on the tiny GPT-2: one row 0.85 ms a step, two 1.4 ms, three 1.5 ms; its vocabulary
projection is per row), so a calm tenant seated beside a flood paid 1.9x its idle time
(`benchmarks/gateway_abuse.py`, two rows). With one row the model serves one request at a
time: among the requests in flight (`request`, from its prefill to its last token), the first
in priority, and no other request's work runs meanwhile, not even while it reads or writes the
cache between its forward passes. Its Python and the decoder thread's share one GIL: with a
flood decoding meanwhile, a calm request's own work ran at half speed (measured: its `complete`
9 -> 17 ms beside a flood, 10 ms with this). A request first in priority takes the model over
at the next token; the time the holder keeps others waiting is charged to its tenant.

The batch's tensors (left-padded rows of one `DynamicCache`) are `padded_batch.py`'s.

Rejected: `transformers`' continuous batching (its paged cache would not take the KV restored
from the node's pages, which is the point of the cache); a lock taken per forward pass with turns in
rotation between tenants (what this replaced: a short request waited one flood step before each
of its own, 3.8x its idle p95). Setting a sequence aside copies its KV once (none when it is the
only row), when the seats change hands, not per token.
Not done: chunked prefill. A long prompt's prefill is one job: decoding pauses for it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from models.llm.padded_batch import PaddedBatch
from models.llm.tenant_usage import TenantUsage

T = TypeVar("T")
_END = None  # a reader's last item: no more tokens


QUANTUM_TOKENS = 8  # a request's first level: its first 8 decoded tokens; each next one doubles


def default_rows(device: str) -> int:
    """Seats in a decode batch: 1 on a CPU (a row costs a large share of the step: module
    docstring), 32 on a GPU (rows cost little until the batch fills the device)."""
    return 1 if device == "cpu" else 32


@dataclass(eq=False)
class Request:
    """One request's claim on the model (`BatchDecoder.request`)."""

    tenant: str
    arrival: int = 0  # among equals, the oldest request first
    decoded: int = 0  # tokens decoded so far: its attained service

    @property
    def level(self) -> int:
        """0 for its first `QUANTUM_TOKENS` tokens, then one more per doubling."""
        return (self.decoded // QUANTUM_TOKENS).bit_length()


@dataclass
class _Job:
    """A forward pass to run on the decoder thread for `request` (a prefill)."""

    request: Request
    fn: Callable[[], Any]
    done: Future[Any]


@dataclass
class _Sequence:
    """One request's decoding: its prefill's KV and logits until it joins the batch."""

    request: Request
    kv: Any  # DynamicCache: (1, heads, length, head_dim) per layer; None while seated
    logits: torch.Tensor | None  # (1, vocab): the next token's; None while seated
    max_tokens: int
    temperature: float
    generator: torch.Generator | None
    tokens: queue.SimpleQueue[int | BaseException | None] = field(default_factory=queue.SimpleQueue)
    produced: int = 0
    cancelled: bool = False


class BatchDecoder:
    """The one thread that runs a model's forward passes (module docstring).

    `with request(tenant) as r:` puts a request in flight; `forward(r, fn)` runs `fn` (its
    prefill) on that thread in its turn and returns its result; `decode(r, ...)` yields its
    tokens as the batch produces them. `rows`: seats per decode round (`default_rows`);
    `usage`: each tenant's recent model time.
    """

    def __init__(
        self, model: Any, eos: set[int], rows: int = 1, usage: TenantUsage | None = None
    ) -> None:
        if rows < 1:
            raise ValueError("a decode batch needs at least one row")
        self.model = model
        self.eos = eos
        self.rows = rows
        self.usage = usage or TenantUsage()
        self._arrivals = 0
        self._in_flight: list[Request] = []
        self._changed = threading.Condition()
        self._jobs: list[_Job] = []
        self._joining: list[_Sequence] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        # touched by the decoder thread only
        self._batch = PaddedBatch(model)
        self._rows: list[_Sequence] = []  # seated: the batch's rows, in order
        self._standing: list[_Sequence] = []  # waiting for a seat, their KV set aside
        self.steps = 0  # batched decode steps run (for tests and metrics)

    @contextmanager
    def request(self, tenant: str) -> Iterator[Request]:
        """A request of `tenant` in flight until the block ends: with one row, the model is
        its while it is first in priority (module docstring)."""
        with self._changed:
            self._arrivals += 1
            request = Request(tenant, self._arrivals)
            self._in_flight.append(request)
            self._changed.notify_all()
        try:
            yield request
        finally:
            with self._changed:
                self._in_flight.remove(request)
                self._changed.notify_all()

    def forward(self, request: Request, fn: Callable[[], T]) -> T:
        """`fn()` on the decoder thread, in inference mode, in `request`'s turn."""
        done: Future[T] = Future()
        with self._changed:
            self._ensure_running()
            self._jobs.append(_Job(request, fn, done))
            self._changed.notify_all()
        return done.result()

    def decode(
        self,
        request: Request,
        kv: Any,
        logits: torch.Tensor,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Generator[int, None, None]:
        """The tokens decoded after a prefill (`kv`, and `logits` (1, vocab) for the next
        token), up to `max_tokens` or the end of sequence (included). Closing the iterator
        early takes the sequence out of the batch at the next round."""
        if max_tokens <= 0:
            return
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=logits.device)
            generator.manual_seed(seed if seed is not None else int(time.time_ns()))
        sequence = _Sequence(request, kv, logits, max_tokens, temperature, generator)
        with self._changed:
            self._ensure_running()
            self._joining.append(sequence)
            self._changed.notify_all()
        try:
            while (item := sequence.tokens.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            sequence.cancelled = True  # read by the decoder thread: a plain flag is enough

    def close(self) -> None:
        """Stop the thread once the work in hand is done."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _ensure_running(self) -> None:
        if self._closed:
            raise RuntimeError("the model's decoder is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="batch-decoder")
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                going, holder = self._wait_for_work()
                if not going:
                    return
                job = self._next_job(holder)
                joining, self._joining = self._joining, []
            with torch.inference_mode():
                if job is not None:
                    self._run_job(job)
                try:
                    self._round(joining, holder)
                except Exception as error:  # a failed step fails its sequences, not the thread
                    failed = {id(s): s for s in [*self._rows, *self._standing, *joining]}
                    for sequence in failed.values():
                        sequence.tokens.put(error)
                    self._keep([])
                    self._standing = []

    def _priority(self, request: Request) -> tuple[int, float, int]:
        return request.level, self.usage.of(request.tenant), request.arrival

    def _wait_for_work(self) -> tuple[bool, Request | None]:
        """(Under the lock.) Wait for work the model may do: (False: closed with none left,
        the request the model serves alone or None). With one row and a request in flight,
        that is the first in flight in priority; the time it keeps others' work waiting is
        charged to its tenant."""
        while True:
            holder = None
            if self.rows == 1 and self._in_flight:
                holder = min(self._in_flight, key=self._priority)
            if self._work(holder):
                return True, holder
            if self._closed and not self._work(None):
                return False, None
            started = time.perf_counter()
            self._changed.wait()
            if holder is not None and self._work(None):
                self.usage.add(holder.tenant, time.perf_counter() - started)

    def _work(self, holder: Request | None) -> bool:
        """Any work (of `holder` only, when one is given)?"""
        waiting = [*self._jobs, *self._joining, *self._rows, *self._standing]
        return any(holder in (None, w.request) for w in waiting)

    def _next_job(self, holder: Request | None) -> _Job | None:
        """The job first in priority (`holder`'s, given one)."""
        jobs = [j for j in self._jobs if holder in (None, j.request)]
        if not jobs:
            return None
        job = min(jobs, key=lambda j: self._priority(j.request))
        self._jobs.remove(job)
        return job

    def _run_job(self, job: _Job) -> None:
        started = time.perf_counter()
        try:
            job.done.set_result(job.fn())
        except BaseException as error:  # handed to the caller, whose request it was
            job.done.set_exception(error)
        self.usage.add(job.request.tenant, time.perf_counter() - started)

    def _round(self, joining: list[_Sequence], holder: Request | None) -> None:
        self._standing += joining
        self._seat(holder)
        if not self._rows:
            return
        assert self._batch.logits is not None
        picked = self._pick(self._batch.logits)
        going = [i for i, row in enumerate(self._rows) if not self._ended(row, picked[i])]
        if len(going) < len(self._rows):
            self._keep(going)
            picked = [picked[i] for i in going]
        if self._rows:
            self._step(picked)

    def _seat(self, holder: Request | None) -> None:
        """Seat this round's sequences (module docstring; only `holder`'s, given one); set
        aside those whose seat went to another; forget those whose reader left."""
        self._standing = [s for s in self._standing if not s.cancelled]
        everyone = sorted(
            [s for s in [*self._rows, *self._standing] if holder in (None, s.request)],
            key=lambda s: self._priority(s.request),
        )
        seated = {id(s) for s in everyone[: self.rows]}
        leaving = [i for i, row in enumerate(self._rows) if id(row) not in seated]
        if leaving:
            self._standing += [self._set_aside(i) for i in leaving]
            self._keep([i for i, row in enumerate(self._rows) if id(row) in seated])
        for sequence in sorted(self._standing, key=lambda s: s.request.arrival):
            if id(sequence) in seated:
                self._admit(sequence)
        self._standing = [s for s in self._standing if id(s) not in seated]

    def _set_aside(self, row: int) -> _Sequence:
        """Row `row`'s KV and logits back on its sequence (it leaves the batch next)."""
        sequence = self._rows[row]
        sequence.kv, sequence.logits = self._batch.take(row)
        return sequence

    def _admit(self, sequence: _Sequence) -> None:
        assert sequence.logits is not None
        self._batch.add(sequence.kv, sequence.logits)
        sequence.kv = sequence.logits = None  # the batch holds them now
        self._rows.append(sequence)

    def _keep(self, rows: list[int]) -> None:
        self._batch.keep(rows)
        self._rows = [self._rows[i] for i in rows]

    def _pick(self, logits: torch.Tensor) -> list[int]:
        """Each row's next token from `logits` (rows, vocab), handed to its reader."""
        greedy = logits.argmax(dim=-1).tolist()
        picked = []
        for i, row in enumerate(self._rows):
            token = greedy[i] if row.temperature <= 0 else _sample(logits[i], row)
            row.produced += 1
            row.request.decoded += 1
            if not row.cancelled:
                row.tokens.put(token)
            picked.append(token)
        return picked

    def _ended(self, row: _Sequence, token: int) -> bool:
        ended = row.cancelled or token in self.eos or row.produced >= row.max_tokens
        if ended:
            row.tokens.put(_END)
        return ended

    def _step(self, tokens: list[int]) -> None:
        """One forward pass over the batch, its time charged to the rows' tenants equally."""
        started = time.perf_counter()
        self._batch.step(tokens)
        self.steps += 1
        share = (time.perf_counter() - started) / len(self._rows)
        for row in self._rows:
            self.usage.add(row.request.tenant, share)


def _sample(logits: torch.Tensor, row: _Sequence) -> int:
    """A token drawn from softmax(`logits` (vocab,) / temperature) with the row's generator,
    by inverting the distribution's CDF at one uniform draw.

    Rather than `torch.multinomial`: on the CPU it took 0.63 ms over a 30k vocabulary, this
    0.04 ms, and a batch of sampled rows paid it per row on every step.
    """
    probs = torch.softmax(logits.double() / row.temperature, dim=-1)
    cdf = torch.cumsum(probs, dim=0)
    draw = torch.rand(1, generator=row.generator, dtype=torch.float64, device=cdf.device)
    # the first token whose CDF passes the draw (scaled to the CDF's own total: never past it)
    return int(torch.searchsorted(cdf, draw * cdf[-1], right=True).clamp_(max=len(cdf) - 1))

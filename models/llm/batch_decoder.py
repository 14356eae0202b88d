"""One model, many requests: one thread runs every forward pass and decodes all sequences together.

Why: a model in this process serves several tenants at once, and one tenant's flood must not
make another's short request slow. Each round of the decoder thread:
1. runs at most one waiting forward job (a request's prefill): the oldest job of the tenant that
   has used the model least lately (`TenantUsage`: least attained service);
2. seats the sequences that decode this round: at most `rows` of them, the least-used tenants'
   first (a tenant's oldest sequences first); the others stand, their KV set aside, until a seat
   is theirs;
3. picks each seated sequence's next token from its logits (greedy, or sampled with its own
   generator), hands it to the sequence's reader and drops the sequences that ended (end of
   sequence, their `max_tokens`, or a reader that stopped reading);
4. advances the others by one token in one forward pass, and charges its time to their tenants.

`rows` by device (`default_rows`): on a GPU a row costs little next to the step, and every
request decoding rides in one forward pass. On a CPU each row costs a large share of the step
(measured on the tiny GPT-2: one row 0.85 ms a step, two 1.4 ms, three 1.5 ms; its vocabulary
projection is per row), so a calm tenant seated beside a flood paid 1.9x its idle time
(`benchmarks/gateway_abuse.py`, two rows); with one row, the least-used tenant decodes alone and
the flood waits the few milliseconds a short request takes.

The batch's KV is one `DynamicCache` whose rows are left-padded: row i holds its sequence's
keys and values right-aligned, `mask` marks its real positions, and each new token's position id
is the count of its real positions, so a padded row computes what it would alone (tested against
decoding alone). Joining pads the shorter side once; a decode step appends one column.

Rejected: `transformers`' continuous batching (its paged cache would not take the KV restored
from the node's pages, which is the point of the cache); padding every step from per-sequence
caches (a copy of every sequence's KV per token); a lock taken per forward pass with turns in
rotation between tenants (what this replaced: a short request waited one flood step before each
of its own, 3.8x its idle p95). Setting a sequence aside copies its KV once (none when it is the
only row), when the seats change hands, not per token.
Not done: chunked prefill. A long prompt's prefill is one job: decoding pauses for it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from models.llm.tenant_usage import TenantUsage

T = TypeVar("T")
_END = None  # a reader's last item: no more tokens


def default_rows(device: str) -> int:
    """Seats in a decode batch: 1 on a CPU (a row costs a large share of the step: module
    docstring), 32 on a GPU (rows cost little until the batch fills the device)."""
    return 1 if device == "cpu" else 32


@dataclass
class _Job:
    """A forward pass to run on the decoder thread for `tenant` (a prefill)."""

    tenant: str
    fn: Callable[[], Any]
    done: Future[Any]


@dataclass
class _Sequence:
    """One request's decoding: its prefill's KV and logits until it joins the batch."""

    tenant: str
    kv: Any  # DynamicCache: (1, heads, length, head_dim) per layer; None while seated
    logits: torch.Tensor | None  # (1, vocab): the next token's; None while seated
    max_tokens: int
    temperature: float
    generator: torch.Generator | None
    tokens: queue.SimpleQueue[int | BaseException | None] = field(default_factory=queue.SimpleQueue)
    produced: int = 0
    cancelled: bool = False
    arrival: int = 0  # among equals, the oldest sequences are seated first


class BatchDecoder:
    """The one thread that runs a model's forward passes (module docstring).

    `forward(tenant, fn)` runs `fn` (a prefill) on that thread in the tenant's turn and returns
    its result; `decode(...)` yields a sequence's tokens as the batch produces them. `rows`:
    seats per decode round (`default_rows`); `usage`: each tenant's recent model time.
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
        self._changed = threading.Condition()
        self._jobs: list[_Job] = []
        self._joining: list[_Sequence] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        # the batch; touched by the decoder thread only
        self._rows: list[_Sequence] = []  # seated
        self._standing: list[_Sequence] = []  # waiting for a seat, their KV set aside
        self._kv: Any = None  # DynamicCache: (rows, heads, width, head_dim) per layer
        self._mask = torch.zeros(0, 0, dtype=torch.long)  # (rows, width): 1 = real position
        self._logits: torch.Tensor | None = None  # (rows, vocab)
        self._padded = False  # some row has padding: the mask and positions must be given
        self.steps = 0  # batched decode steps run (for tests and metrics)

    def forward(self, tenant: str, fn: Callable[[], T]) -> T:
        """`fn()` on the decoder thread, in inference mode, in `tenant`'s turn."""
        done: Future[T] = Future()
        with self._changed:
            self._ensure_running()
            self._jobs.append(_Job(tenant, fn, done))
            self._changed.notify_all()
        return done.result()

    def decode(
        self,
        tenant: str,
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
        sequence = _Sequence(tenant, kv, logits, max_tokens, temperature, generator)
        with self._changed:
            self._ensure_running()
            self._arrivals += 1
            sequence.arrival = self._arrivals
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
                while not (self._busy() or self._closed):
                    self._changed.wait()
                if self._closed and not self._busy():
                    return
                job = self._next_job()
                joining, self._joining = self._joining, []
            with torch.inference_mode():
                if job is not None:
                    self._run_job(job)
                try:
                    self._round(joining)
                except Exception as error:  # a failed step fails its sequences, not the thread
                    failed = {id(s): s for s in [*self._rows, *self._standing, *joining]}
                    for sequence in failed.values():
                        sequence.tokens.put(error)
                    self._reset()
                    self._standing = []

    def _busy(self) -> bool:
        return bool(self._jobs or self._joining or self._rows or self._standing)

    def _next_job(self) -> _Job | None:
        """The oldest job of the least-used tenant with one waiting."""
        if not self._jobs:
            return None
        job = min(self._jobs, key=lambda j: self.usage.of(j.tenant))  # (min: the first of ties)
        self._jobs.remove(job)
        return job

    def _run_job(self, job: _Job) -> None:
        started = time.perf_counter()
        try:
            job.done.set_result(job.fn())
        except BaseException as error:  # handed to the caller, whose request it was
            job.done.set_exception(error)
        self.usage.add(job.tenant, time.perf_counter() - started)

    def _round(self, joining: list[_Sequence]) -> None:
        self._standing += joining
        self._seat()
        if not self._rows:
            return
        assert self._logits is not None
        picked = self._pick(self._logits)
        going = [i for i, row in enumerate(self._rows) if not self._ended(row, picked[i])]
        if len(going) < len(self._rows):
            self._keep(going)
            picked = [picked[i] for i in going]
        if self._rows:
            self._step(picked)

    def _seat(self) -> None:
        """Seat this round's sequences (module docstring); set aside those whose seat went to
        another tenant, and forget the standing ones whose reader left."""
        self._standing = [s for s in self._standing if not s.cancelled]
        usage = {s.tenant: self.usage.of(s.tenant) for s in [*self._rows, *self._standing]}
        everyone = sorted(
            [*self._rows, *self._standing], key=lambda s: (usage[s.tenant], s.arrival)
        )
        seated = {id(s) for s in everyone[: self.rows]}
        leaving = [i for i, row in enumerate(self._rows) if id(row) not in seated]
        if leaving:
            self._standing += [self._set_aside(i) for i in leaving]
            self._keep([i for i, row in enumerate(self._rows) if id(row) in seated])
        for sequence in sorted(self._standing, key=lambda s: s.arrival):
            if id(sequence) in seated:
                self._admit(sequence)
        self._standing = [s for s in self._standing if id(s) not in seated]

    def _set_aside(self, row: int) -> _Sequence:
        """Row `row`'s KV (its real positions, copied unless it is the only row) and logits
        back on its sequence."""
        from transformers import DynamicCache

        assert self._logits is not None
        sequence = self._rows[row]
        if len(self._rows) == 1:
            sequence.kv, sequence.logits = self._kv, self._logits
            return sequence
        first = int(self._mask[row].nonzero()[0])
        layers = [
            (layer.keys[row : row + 1, :, first:].clone(),
             layer.values[row : row + 1, :, first:].clone())
            for layer in self._kv.layers
        ]  # fmt: skip
        sequence.kv = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        sequence.logits = self._logits[row : row + 1].clone()
        return sequence

    def _pick(self, logits: torch.Tensor) -> list[int]:
        """Each row's next token from `logits` (rows, vocab), handed to its reader."""
        greedy = logits.argmax(dim=-1).tolist()
        picked = []
        for i, row in enumerate(self._rows):
            token = greedy[i] if row.temperature <= 0 else _sample(logits[i], row)
            row.produced += 1
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
        """Every row one token further: one forward pass over the batch, its time charged to
        the rows' tenants in equal shares."""
        started = time.perf_counter()
        device = self._mask.device
        ids = torch.tensor(tokens, device=device).unsqueeze(1)  # (rows, 1)
        positions = self._mask.sum(dim=1, keepdim=True)  # (rows, 1): each row's real length
        self._mask = torch.cat([self._mask, torch.ones_like(positions)], dim=1)
        if self._padded:
            out = self.model(
                ids, cache=self._kv, attention_mask=self._mask, position_ids=positions,
                use_cache=True,
            )  # fmt: skip
        else:  # no row is padded: the model's own positions and causal mask (a faster path)
            out = self.model(ids, cache=self._kv, use_cache=True)
        self._kv, self._logits = out.cache, out.logits[:, -1]
        self.steps += 1
        share = (time.perf_counter() - started) / len(self._rows)
        for row in self._rows:
            self.usage.add(row.tenant, share)

    def _admit(self, sequence: _Sequence) -> None:
        """`sequence` joins the batch as its last row; the narrower side is padded on the left."""
        assert sequence.logits is not None
        length = sequence.kv.layers[0].keys.shape[2]
        mask = torch.ones(1, length, dtype=torch.long, device=sequence.logits.device)
        if not self._rows:
            self._kv, self._mask, self._logits = sequence.kv, mask, sequence.logits
        else:
            assert self._logits is not None
            width = max(length, self._mask.shape[1])
            for layer, new in zip(self._kv.layers, sequence.kv.layers, strict=True):
                layer.keys = torch.cat([_pad_left(layer.keys, width), _pad_left(new.keys, width)])
                layer.values = torch.cat(
                    [_pad_left(layer.values, width), _pad_left(new.values, width)]
                )
            self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
            self._logits = torch.cat([self._logits, sequence.logits])
        sequence.kv = sequence.logits = None  # the batch holds them now
        self._rows.append(sequence)
        self._padded = not bool(self._mask.all())

    def _keep(self, rows: list[int]) -> None:
        """Only `rows` stay; columns no remaining row uses are cut from the left."""
        if not rows:
            self._reset()
            return
        index = torch.tensor(rows, device=self._mask.device)
        used = self._mask[index].any(dim=0)
        first = int(used.nonzero()[0])
        for layer in self._kv.layers:
            layer.keys = layer.keys[index, :, first:]
            layer.values = layer.values[index, :, first:]
        self._mask = self._mask[index, first:]
        assert self._logits is not None
        self._logits = self._logits[index]
        self._rows = [self._rows[i] for i in rows]
        self._padded = not bool(self._mask.all())

    def _reset(self) -> None:
        """An empty batch (the standing sequences are not touched)."""
        self._rows, self._kv, self._logits, self._padded = [], None, None, False
        self._mask = torch.zeros(0, 0, dtype=torch.long)


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


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """`tensor` (rows, ..., positions[, head_dim]) with zeros prepended up to `width` positions:
    dimension 2 for KV (rows, heads, positions, head_dim), dimension 1 for a mask."""
    axis = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[axis]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=axis)

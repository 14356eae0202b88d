"""Running a warm-up plan without Prefect: backends, the node's resources, batches, summary.

The plain half of the `warmup` flow (`flows.warmup.flow` adds the Prefect tasks, the node's
concurrency limit and retries) and the whole of `preheat warmup`, which runs the batches one
after another in its own process (`warm_locally`): one process has nothing to share a limit
with, and it saves the ~15 s a temporary Prefect API takes to start.

Batches keep the plan's execution order (its SLA priority) cut into consecutive chunks; a batch
names the earlier batches that hold parents of its items, which it must follow. Rejected:
batching by dependency level, which would warm every parent before any urgent child.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cache_runtime import telemetry
from cache_runtime.node_cache import node_cache, node_settings
from cache_runtime.settings import Settings
from models.warmup.execute import (
    BatchStats,
    NullBackend,
    WarmItem,
    WarmLedger,
    backend_target,
    execute_batch,
    plan_id,
)
from models.warmup.plan import MB, Budgets
from models.warmup.prepare import missing_sqlite_store

BACKENDS = ("hf", "openai", "null")


class WarmupIncomplete(RuntimeError):
    """Some items failed (after retries); the message says how many and how to resume."""


@dataclass(frozen=True)
class BackendSpec:
    """Which backend to warm with, in plain values (task parameters cross processes)."""

    kind: str = "hf"
    model_path: str | None = None
    mlflow_uri: str | None = None
    base_url: str | None = None
    model_name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in BACKENDS:
            raise ValueError(f"backend {self.kind!r}: choose one of {', '.join(BACKENDS)}")
        if self.kind == "openai" and not (self.base_url and self.model_name):
            raise ValueError("the openai backend needs a base URL and a served model name")


def open_backend(
    spec: BackendSpec, data_dir: str | Path | None = None, node: str | None = None
) -> Any:
    """The backend `spec` names: a local HF directory, else the `preheat-llm` version deployed
    on `node` (default: this host) under `data_dir`, else the registry's champion; an
    OpenAI-compatible server; or the null backend (a dry run).

    The deployed copy comes before the registry: warm-up must fill pages for the weights the
    node serves (pages are keyed by their fingerprint), which are the deployed version until
    the next `deploy-models` run, even after the alias has moved; and it loads from local disk.

    Raises:
        LookupError: hf without a model path, nothing deployed, and no registered champion.
    """
    from models.llm.backends import OpenAICompatibleBackend

    if spec.kind == "null":
        return NullBackend()
    if spec.kind == "openai":
        return OpenAICompatibleBackend(str(spec.base_url), str(spec.model_name))
    return open_hf_backend(spec.model_path, spec.mlflow_uri, data_dir, node)


def open_hf_backend(
    model_path: str | Path | None, mlflow_uri: str | None, data_dir: str | Path | None,
    node: str | None = None, device: str | None = None, purpose: str = "to warm with",
) -> Any:  # fmt: skip
    """The in-process LLM of a node, for warm-up and the gateway alike: `model_path`, else the
    `preheat-llm` version deployed on `node` under `data_dir`, else the registry's champion.

    Raises:
        LookupError: no model path, nothing deployed, and no store to find a champion in.
    """
    from models.llm.backends import HFBackend
    from models.node_manifest import LLM_MODEL, deployed_model, node_name

    if model_path:
        return HFBackend.from_path(model_path, device)
    deployed = deployed_model(data_dir, LLM_MODEL, node) if data_dir is not None else None
    if deployed is not None:
        entry, path = deployed
        backend = HFBackend.from_path(path, device)
        backend.source = f"{LLM_MODEL} version {entry.version} deployed on {node_name(node)}"
        return backend
    uri = mlflow_uri or Settings().mlflow_uri
    if missing_sqlite_store(uri):  # looking would create the store
        raise LookupError(
            f"no LLM {purpose}: give a model path (--model-path) or register one in {uri}"
        )
    return HFBackend.from_registry(uri, device=device)


@dataclass(frozen=True)
class NodeResources:
    """The backend and the node's cache, in plain values (task parameters cross processes)."""

    backend: BackendSpec
    data_dir: str
    redis_url: str | None = None
    memory_bytes: int = 256 * MB
    ssd_bytes: int = 2048 * MB

    @classmethod
    def for_budgets(
        cls, backend: BackendSpec, data_dir: str, redis_url: str | None, budgets: Budgets
    ) -> NodeResources:
        """The node's cache sized by a plan's budgets. The SSD tier is written through (what
        memory holds, it holds too), so it gets the memory tier's bytes on top of its own."""
        return cls(
            backend, data_dir, redis_url, budgets.memory_bytes,
            budgets.memory_bytes + budgets.ssd_bytes,
        )  # fmt: skip


@dataclass(frozen=True)
class WarmupJob:
    """Everything a batch needs: resources, and the ledger's plan and target."""

    resources: NodeResources
    plan_id: str
    target: str

    @property
    def ledger_path(self) -> Path:
        return WarmLedger.path_for(self.resources.data_dir, self.plan_id)


_OPENED: dict[NodeResources, tuple[Any, Any]] = {}
_OPENED_LOCK = threading.Lock()
_TEMPLATES: dict[str, dict[str, Any]] = {}  # data dir -> tenant -> its template assigner


def shared_resources(spec: NodeResources) -> tuple[Any, Any]:
    """(backend, cache), opened once per process and shared by its batches: a model loads in
    seconds, and the memory tier is per process. Closed by `release_resources`."""
    with _OPENED_LOCK:
        if spec not in _OPENED:
            settings = node_settings(spec.data_dir, spec.redis_url)
            cache = node_cache(settings, spec.memory_bytes, spec.ssd_bytes)
            try:
                _OPENED[spec] = (open_backend(spec.backend, spec.data_dir), cache)
            except BaseException:
                cache.close()
                raise
        return _OPENED[spec]


def shared_template_of(data_dir: str) -> Callable[[str, str], str | None]:
    """(tenant, prompt) -> its mined template, from the table the gateway assigns with
    (loaded once per process)."""
    with _OPENED_LOCK:
        if data_dir not in _TEMPLATES:
            from models.templates.mined import load_assigners

            _TEMPLATES[data_dir] = load_assigners(data_dir)
        assigners = _TEMPLATES[data_dir]

    def template_of(tenant: str, prompt: str) -> str | None:
        assigner = assigners.get(tenant)
        return assigner.assign(prompt) if assigner is not None else None

    return template_of


def release_resources(spec: NodeResources) -> None:
    with _OPENED_LOCK:
        opened = _OPENED.pop(spec, None)
    if opened is not None:
        backend, cache = opened
        backend.close()
        cache.close()


# -- batches ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Consecutive plan items; `after`: the earlier batches holding parents of its items."""

    index: int
    items: list[WarmItem]
    after: tuple[int, ...] = field(default=())


def dependency_batches(items: Sequence[WarmItem], batch_size: int) -> list[Batch]:
    """The plan order cut into batches of `batch_size`, each naming the batches it waits for."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    ordered = sorted(items, key=lambda i: i.order)
    chunks = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    where = {item.ident: k for k, chunk in enumerate(chunks) for item in chunk}
    batches = []
    for k, chunk in enumerate(chunks):
        parents = {where.get((i.tenant, i.parent)) for i in chunk if i.parent is not None}
        after = tuple(sorted(j for j in parents if j is not None and j < k))
        batches.append(Batch(k, chunk, after))
    return batches


def run_batch(items: Sequence[WarmItem], job: WarmupJob, index: int | None = None) -> BatchStats:
    """One batch against the job's ledger, backend and cache (opened once per process), in a
    `warmup.batch` span (plan, target, batch `index`, what it did; a no-op unless tracing is
    configured, see `cache_runtime.telemetry`)."""
    attributes: dict[str, Any] = {"preheat.warmup.plan_id": job.plan_id,
                                  "preheat.warmup.target": job.target,
                                  "preheat.warmup.items": len(items)}  # fmt: skip
    if index is not None:
        attributes["preheat.warmup.batch"] = index
    tracer = telemetry.tracer("preheat.warmup")
    with tracer.start_as_current_span("warmup.batch", attributes=attributes) as span:
        backend, cache = shared_resources(job.resources)
        ledger = WarmLedger(job.ledger_path, job.target)
        try:
            template_of = shared_template_of(job.resources.data_dir)
            stats = execute_batch(items, backend, cache, ledger, template_of=template_of)
        finally:
            ledger.close()
        if span.is_recording():
            for name, value in stats.as_dict().items():
                span.set_attribute(f"preheat.warmup.{name}", value)
        return stats


# -- one warm-up ------------------------------------------------------------------------------


@dataclass
class OpenedJob:
    job: WarmupJob
    items: list[WarmItem]
    before: dict[tuple[str, str], str]  # ledger states when the run started
    started: float = field(default_factory=time.perf_counter)


def open_job(items: list[WarmItem], resources: NodeResources) -> OpenedJob:
    """Open the backend (its model names the ledger's target) and register the items."""
    backend, _ = shared_resources(resources)
    job = WarmupJob(resources, plan_id(items), backend_target(backend))
    ledger = WarmLedger(job.ledger_path, job.target)
    try:
        ledger.register(items)
        before = ledger.states()
    finally:
        ledger.close()
    return OpenedJob(job, items, before)


def summarise_run(opened: OpenedJob) -> dict[str, Any]:
    """planned / done / skipped_already_done / failed / unresolved / seconds, from the ledger:
    right after retries and kills, which task results would not be."""
    ledger = WarmLedger(opened.job.ledger_path, opened.job.target)
    try:
        rows = ledger.frame()
    finally:
        ledger.close()
    finals = ("done", "unresolved")
    earlier = [ident for ident, state in opened.before.items() if state in finals]
    idents = pd.MultiIndex.from_arrays([rows["tenant"], rows["item"]])
    already = idents.isin(earlier) if earlier else np.zeros(len(rows), dtype=bool)
    now = rows[~already]
    return {
        "plan_id": opened.job.plan_id,
        "target": opened.job.target,
        "ledger": str(opened.job.ledger_path),
        "planned": len(opened.items),
        "done": int((now["state"] == "done").sum()),
        "skipped_already_done": int(already.sum()),
        "failed": int((~now["state"].isin(finals)).sum()),
        "unresolved": int((now["state"] == "unresolved").sum()),
        "pages_stored": int(now["pages_stored"].fillna(0).sum()),
        "seconds": round(time.perf_counter() - opened.started, 3),
    }


def warm_locally(opened: OpenedJob, batch_size: int = 32) -> dict[str, Any]:
    """The CLI's path: the same batches, one after another in this process, no Prefect API."""
    try:
        for batch in dependency_batches(opened.items, batch_size):
            run_batch(batch.items, opened.job, batch.index)
    finally:
        release_resources(opened.job.resources)
    return summarise_run(opened)

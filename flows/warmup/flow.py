"""Prefect flow `warmup`: plan from the lake, then warm the plan in batches, resumably.

Thin wiring around `models.warmup.prepare` (the plan), `models.warmup.items` (each item's text),
`models.warmup.execute` (ledger, warming) and `models.warmup.run` (batches, resources, summary):

- **Dependencies.** Each batch is submitted with `wait_for` on the earlier batches holding its
  items' parents, wrapped in `allow_failure`: a child's warm prefills its whole text, parent
  pages included, so a failed parent only costs work, never correctness.
- **Concurrency.** The node's Prefect global concurrency limit `warmup-<node>` bounds the
  batches running on a node across all warm-up runs (a schedule and a manual run share it).
  A run holds `min(max_concurrency, limit)` slots through the `concurrency` context manager
  while it executes, and never has more batches in flight than it holds slots. The limit is
  created with `max_concurrency` when missing; an existing one is the operator's, left as it
  is. Rejected, both measured on the test harness (SQLite-backed API): a slot per batch
  (`concurrency` inside the task: each acquisition met "database is locked" 503s and a
  client retry, ~1-2 s per batch even with free slots) and a task tag limit (`tag:...`,
  slots taken by the task engine: 30 s for 20 no-op tasks under a limit of 2, waits capped
  at 30 s each). One acquisition per run costs one round trip.
- **Retries and resumption.** A batch with failed items raises, so Prefect retries it (twice);
  every retry and every later run reads the ledger and redoes only what is not done. The
  summary is counted from the ledger, not from task results, so it is right after retries.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed, wait
from prefect.utilities.annotations import allow_failure

from models.warmup.execute import WarmItem, resolve_items
from models.warmup.plan import Budgets
from models.warmup.prepare import EmptyLake, PlanOptions, plan_from_lake
from models.warmup.run import (
    BackendSpec,
    Batch,
    NodeResources,
    OpenedJob,
    WarmupIncomplete,
    WarmupJob,
    dependency_batches,
    open_job,
    release_resources,
    run_batch,
    summarise_run,
)


def _logger() -> Any:
    try:
        return get_run_logger()
    except Exception:  # outside a Prefect run (the CLI's plain calls)
        return logging.getLogger(__name__)


@contextmanager
def node_slots(limit_name: str, occupy: int) -> Iterator[None]:
    """Hold `occupy` slots of the node's limit for the block (strict: a missing limit is an
    error, not the absence of a limit). A lease renewal that fails once does not kill the run:
    the slots then lapse, which at worst lets one more batch run on the node."""
    from prefect.concurrency.sync import concurrency

    with concurrency(limit_name, occupy=occupy, strict=True, raise_on_lease_renewal_failure=False):
        yield


@task(
    name="warm-batch",
    retries=2,
    retry_delay_seconds=[2, 10],
    cache_policy=NO_CACHE,
    task_run_name="warm-batch-{index}",
)
def warm_batch_task(index: int, items: list[WarmItem], job: WarmupJob) -> dict[str, Any]:
    """Warm one batch; raise (so Prefect retries the items not done) when any item failed."""
    stats = run_batch(items, job, index)
    _logger().info(
        "batch %d: %d done, %d already done, %d failed, %d unresolved, %d pages in %.2f s",
        index, stats.done, stats.skipped_already_done, stats.failed, stats.unresolved,
        stats.pages_stored, stats.seconds,
    )  # fmt: skip
    if stats.failed:
        raise WarmupIncomplete(f"batch {index}: {stats.failed} of {stats.planned} items failed")
    return stats.as_dict()


def submit_batches(
    batches: Sequence[Batch], job: WarmupJob, max_concurrency: int
) -> list[PrefectFuture[dict[str, Any]]]:
    """Submit in plan order, at most `max_concurrency` in flight; wait for all of them."""
    futures: dict[int, PrefectFuture[dict[str, Any]]] = {}
    in_flight: list[PrefectFuture[dict[str, Any]]] = []
    for batch in batches:
        while len(in_flight) >= max(1, max_concurrency):
            in_flight.remove(next(as_completed(in_flight)))
        parents = [allow_failure(futures[j]) for j in batch.after]
        future = warm_batch_task.submit(batch.index, batch.items, job, wait_for=parents)
        futures[batch.index] = future
        in_flight.append(future)
    wait(list(futures.values()))
    return list(futures.values())


def ensure_node_limit(name: str, limit: int) -> int:
    """Create the node's global concurrency limit if missing; returns the limit in force."""
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return int(client.read_global_concurrency_limit_by_name(name).limit)
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=max(1, limit))
            )
        except ObjectAlreadyExists:  # another run created it meanwhile
            return int(client.read_global_concurrency_limit_by_name(name).limit)
    return max(1, limit)


def node_limit_name(node: str | None = None) -> str:
    """`warmup-<node>` (the host name by default), in the characters limit names allow."""
    return "warmup-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", node or socket.gethostname())


def execute_plan(
    items: list[WarmItem], resources: NodeResources, limit_name: str, max_concurrency: int,
    batch_size: int,
) -> OpenedJob:  # fmt: skip
    """Open the job, hold the node's slots while its batches run, release what was opened."""
    try:
        opened = open_job(items, resources)
        occupy = min(max(1, max_concurrency), ensure_node_limit(limit_name, max_concurrency))
        batches = dependency_batches(opened.items, batch_size)
        get_run_logger().info(
            "plan %s: %d items in %d batches for %s; %d already done; %d slots of %s",
            opened.job.plan_id, len(opened.items), len(batches), opened.job.target,
            sum(s in ("done", "unresolved") for s in opened.before.values()), occupy, limit_name,
        )  # fmt: skip
        with node_slots(limit_name, occupy):
            submit_batches(batches, opened.job, occupy)
    finally:
        release_resources(resources)
    return opened


@task(name="plan-warmup", cache_policy=NO_CACHE)
def plan_task(data_dir: str, mlflow_uri: str, options: PlanOptions) -> dict[str, Any]:
    """The plan's items with their texts, and the planner's summary."""
    prepared = plan_from_lake(Path(data_dir), mlflow_uri, options)
    items = resolve_items(prepared.result.plan, prepared.recent)
    return {"items": items, "plan": prepared.summary}


@flow(name="warmup")
def warmup_flow(
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    memory_mb: float = 256,
    ssd_mb: float = 2048,
    redis_mb: float = 0,
    compute_s: float = 60,
    deadline_s: float = 120,
    granularity: str = "3min",
    prefill_ms_per_token: float = 0.35,
    backend: str = "hf",
    model_path: str | None = None,
    base_url: str | None = None,
    model_name: str | None = None,
    redis_url: str | None = None,
    batch_size: int = 32,
    max_concurrency: int = 2,
    node: str | None = None,
    skip_if_empty: bool = False,
) -> dict[str, Any]:
    """Plan a warm-up and execute it; returns the run's summary (and the plan's under "plan").

    `skip_if_empty` (the scheduled deployments set it) turns "the lake holds no requests yet"
    into a completed run that says so, instead of a failure every ten minutes on a new install.

    Raises:
        WarmupIncomplete: items still failed after the retries; rerun to resume them.
    """
    budgets = Budgets.from_mb(memory_mb, ssd_mb, redis_mb, compute_s, deadline_s)
    options = PlanOptions(budgets, granularity, prefill_ms_per_token / 1000)
    try:
        planned = plan_task(data_dir, mlflow_uri, options)
    except EmptyLake as err:
        if not skip_if_empty:
            raise
        get_run_logger().warning("nothing to warm: %s", err)
        return {"skipped": str(err)}
    backend_spec = BackendSpec(backend, model_path, mlflow_uri, base_url, model_name)
    resources = NodeResources.for_budgets(backend_spec, data_dir, redis_url, budgets)
    opened = execute_plan(
        planned["items"], resources, node_limit_name(node), max_concurrency, batch_size
    )
    summary = {**summarise_run(opened), "plan": planned["plan"]}
    get_run_logger().info(
        "warm-up %s: %d done, %d already done, %d failed, %d unresolved in %.1f s",
        summary["plan_id"], summary["done"], summary["skipped_already_done"],
        summary["failed"], summary["unresolved"], summary["seconds"],
    )  # fmt: skip
    if summary["failed"]:
        raise WarmupIncomplete(
            f"{summary['failed']} of {summary['planned']} items failed; rerun to resume "
            f"(ledger {summary['ledger']})"
        )
    return summary

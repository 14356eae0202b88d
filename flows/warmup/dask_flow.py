"""The `warmup` flow with its batches fanned out over a Dask cluster (prefect-dask).

Deployment entrypoint: `flows.warmup.dask_flow.warmup_dask_flow`. It is `warmup_flow` itself
(name "warmup", same parameters, same dependencies, node limit, retries and ledger) with a
`DaskTaskRunner` instead of the default thread pool: each batch runs in a Dask worker process.

**Where the cluster comes from.** Read from the environment when this module is imported: a
deployment's worker imports the entrypoint in the flow run's own process and calls the object
it finds, so the environment of the node that runs the flow decides, and a flow object carries
no per-call runner argument. Only configuration is read at import; no cluster starts here.

- `PREHEAT_DASK_ADDRESS` (e.g. `tcp://coordinator:8786`): connect to a running scheduler,
  the multi-node case. Its workers must import this project and see `data_dir` (the ledger
  and the SSD tier live there; SQLite WAL needs a local file system, so workers on other hosts
  need the Redis tier and their own data dir — see `dask_task_runner`).
- else a `distributed.LocalCluster` of `PREHEAT_DASK_WORKERS` worker processes (default 2),
  one thread each, on 127.0.0.1 without a dashboard, started for each flow run and stopped
  at its end.

**Per-process resources.** A batch opens the backend and the cache lazily in the process that
runs it (`models.warmup.run.shared_resources`), so each Dask worker loads its own model once
and reuses it for every later batch it runs. A temporary cluster releases them with its
workers at the end of the run; a long-lived external cluster keeps a model loaded per worker
(a warm model cache: the next run skips the load), held until the worker process exits — one
per distinct backend, data dir and budgets, so runs with many different parameters on one
cluster accumulate them. The flow's own `release_resources` only closes what the flow
process opened.

**Settings on the workers.** prefect-dask serialises the Prefect settings context with every
task (`prefect.context.serialize_context`) and the worker re-enters it, so worker processes
talk to the flow's API even when that URL exists only in a temporary settings context (as
under `prefect_test_harness`); environment variables are inherited by a LocalCluster's
workers. Everything a batch receives is a frozen dataclass of plain values (`WarmItem`,
`WarmupJob`, `NodeResources`), which pickles.

**Order, not placement.** A batch's `wait_for` (the batches holding its items' parents) orders
it; it moves no data. prefect-dask hands those futures to Dask as dependencies, and Dask runs
a task only on a worker holding its dependencies' results (`decide_worker`): as a plan's
system-prompt parents sit in its first batch, every later batch followed batch 0 onto one
worker (measured: 11 of 11 batches on one of two workers; work stealing did not move them).
`OrderOnlyDaskTaskRunner` therefore waits for those futures in the flow process and passes
their final states: the same upstream checks (`allow_failure` included) on the worker, no
Dask dependency, so Dask puts each batch on an idle worker. It costs no parallelism: a batch
waiting for its parents holds one of the flow's `max_concurrency` slots either way.

**Cost.** Each batch pays more Prefect work than on the thread pool: the flow process
serialises the whole settings context for every task, and the worker builds two API clients
and re-validates the settings for every task (profiled: ~75% of a worker's time on null
batches). `benchmarks/warmup.py` measured ~3 ms of orchestration per item at 32 items a batch
on 2 cores (0.4 ms on the thread pool), ~7 ms when the cores were shared with other work; a
temporary cluster adds ~2 s of start-up per run. Larger batches amortise it.

Rejected: `DaskTaskRunner(cluster=LocalCluster(...))` built here — Prefect runs a flow with
`task_runner.duplicate()`, which drops a `cluster` instance (prefect-dask 0.3.7), and it would
start processes at import; and a cluster kept alive across runs inside the flow's process,
which a process worker (one process per flow run) could not reuse anyway.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from prefect import Flow
from prefect.utilities.collections import visit_collection
from prefect_dask import DaskTaskRunner
from prefect_dask.task_runners import PrefectDaskFuture

from flows.warmup.flow import warmup_flow

ADDRESS_ENV = "PREHEAT_DASK_ADDRESS"
WORKERS_ENV = "PREHEAT_DASK_WORKERS"
DEFAULT_WORKERS = 2


class OrderOnlyDaskTaskRunner(DaskTaskRunner):
    """A `DaskTaskRunner` whose `wait_for` orders tasks without tying them to the worker that
    ran their upstreams (see "Order, not placement" above)."""

    def submit(  # type: ignore[override]  # the same signature, minus the overloads
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[Any] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> PrefectDaskFuture[Any]:
        states = settled(list(wait_for)) if wait_for else None
        return super().submit(task, parameters, states, dependencies)


def settled(expr: Any) -> Any:
    """`expr` with each Dask-backed future (also inside `allow_failure`) replaced by its final
    state, waiting for it; what is not such a future passes unchanged."""

    def settle(value: Any) -> Any:
        if isinstance(value, PrefectDaskFuture):
            value.wait()
            return value.state
        return value

    return visit_collection(expr, visit_fn=settle, return_data=True)


def local_cluster_kwargs(n_workers: int) -> dict[str, Any]:
    """A LocalCluster of `n_workers` single-threaded worker processes (one batch at a time
    each; Dask's nanny sets OMP_NUM_THREADS=1 in them) on the loopback interface only.

    No dashboard, and the scheduler's remaining HTTP endpoints (health, metrics) on a free
    loopback port. Rejected, measured with distributed 2026.8: `dashboard_address=None`
    alone still binds those endpoints to the fixed port 8787, so a second cluster on the node
    warns "Port 8787 is already in use" (an error under our tests' warning filter); and
    `dashboard_address=":0"` binds 0.0.0.0, every interface.
    """
    return {
        "n_workers": n_workers,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": None,
        "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
    }


def dask_task_runner(address: str | None, n_workers: int = DEFAULT_WORKERS) -> DaskTaskRunner:
    """The runner for warm-up batches: the scheduler at `address`, else a temporary
    LocalCluster of `n_workers` processes per flow run.

    With `address`, the flow's `max_concurrency` (and the node's limit `warmup-<node>`, named
    after the host running the flow) still bounds the batches in flight; raise both to use
    more of a large cluster. Workers on other hosts warm into their own data dir and SSD tier
    and share what they warm only through the Redis tier (`redis_url`).

    Raises:
        ValueError: `n_workers` below 1, or an address without a scheme (`tcp://host:8786`):
            Dask would silently assume TCP, and a bare `host:port` is usually a mistyped URL.
    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    if address is not None:
        scheme, separator, location = address.partition("://")
        if not (scheme and separator and location):
            raise ValueError(
                f"Dask scheduler address {address!r} needs a scheme and a location, "
                "e.g. tcp://coordinator:8786"
            )
        return OrderOnlyDaskTaskRunner(address=address)
    # cluster_class + kwargs, not a cluster instance: see the module docstring.
    return OrderOnlyDaskTaskRunner(
        cluster_class="distributed.LocalCluster", cluster_kwargs=local_cluster_kwargs(n_workers)
    )


def runner_from_env(environ: Mapping[str, str] | None = None) -> DaskTaskRunner:
    """`dask_task_runner` configured by `PREHEAT_DASK_ADDRESS` / `PREHEAT_DASK_WORKERS`
    (empty values count as unset).

    Raises:
        ValueError: a worker count that is not an integer >= 1, or a bad address.
    """
    env = os.environ if environ is None else environ
    address = env.get(ADDRESS_ENV) or None
    workers = env.get(WORKERS_ENV) or str(DEFAULT_WORKERS)
    try:
        n_workers = int(workers)
    except ValueError:
        raise ValueError(f"{WORKERS_ENV}={workers!r}: expected a whole number >= 1") from None
    return dask_task_runner(address, n_workers)


def warmup_on_dask(runner: DaskTaskRunner) -> Flow[..., dict[str, Any]]:
    """`warmup_flow` with `runner` as its task runner; everything else unchanged."""
    return warmup_flow.with_options(task_runner=runner)


warmup_dask_flow = warmup_on_dask(runner_from_env())

"""The `warmup` flow fanned out over Dask (`flows.warmup.dask_flow`), on a real Prefect API and
a real LocalCluster of two worker processes.

The cluster is the test's own, reached by address (the `PREHEAT_DASK_ADDRESS` path): it
outlives the flow runs, so the test can ask each worker afterwards what it executed. The lake
is built as test_warmup_flow builds its own (generated requests, each prompt behind its
tenant's system prompt, so KV items span several pages).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin
from helpers import ledger_frame, write_warmable_lake

from cache_runtime.keys import EmbeddingKey
from cache_runtime.kv_pages import page_keys
from cache_runtime.settings import Settings

BUDGETS = {"memory_mb": 0.5, "ssd_mb": 1.0, "compute_s": 1.0, "deadline_s": 1.0}


# -- the runner's configuration (no cluster) -------------------------------------------------


@pytest.mark.parametrize(
    ("address", "n_workers", "message"),
    [
        (None, 0, "n_workers must be at least 1, got 0"),
        ("tcp://coordinator:8786", -2, "n_workers must be at least 1, got -2"),
        ("coordinator:8786", 2, "'coordinator:8786' needs a scheme"),
        ("tcp://", 2, "'tcp://' needs a scheme and a location"),
        ("://coordinator:8786", 2, "needs a scheme"),
    ],
)
def test_dask_task_runner_rejects_bad_values(
    address: str | None, n_workers: int, message: str
) -> None:
    from flows.warmup.dask_flow import dask_task_runner

    with pytest.raises(ValueError, match=message):
        dask_task_runner(address, n_workers)


def test_runner_from_env_reads_the_address_or_the_worker_count() -> None:
    from flows.warmup.dask_flow import local_cluster_kwargs, runner_from_env

    local = runner_from_env({})
    assert local.address is None and local.cluster_class == "distributed.LocalCluster"
    assert local.cluster_kwargs == local_cluster_kwargs(2)
    assert local.cluster_kwargs["dashboard_address"] is None
    assert local.cluster_kwargs["host"] == "127.0.0.1"
    assert runner_from_env({"PREHEAT_DASK_WORKERS": "3"}).cluster_kwargs["n_workers"] == 3
    remote = runner_from_env({"PREHEAT_DASK_ADDRESS": "tcp://coordinator:8786"})
    assert remote.address == "tcp://coordinator:8786" and not remote.cluster_kwargs
    copy = remote.duplicate()  # what a flow run actually uses: the same kind, the same address
    assert type(copy) is type(remote) and copy == remote
    with pytest.raises(ValueError, match=r"PREHEAT_DASK_WORKERS='two': expected a whole"):
        runner_from_env({"PREHEAT_DASK_WORKERS": "two"})
    with pytest.raises(ValueError, match="n_workers must be at least 1"):
        runner_from_env({"PREHEAT_DASK_WORKERS": "0"})


def test_the_entrypoint_is_the_warmup_flow_on_a_dask_runner() -> None:
    from prefect.flows import load_flow_from_entrypoint

    from flows.warmup.dask_flow import OrderOnlyDaskTaskRunner
    from flows.warmup.flow import warmup_flow

    loaded = load_flow_from_entrypoint("flows.warmup.dask_flow.warmup_dask_flow")
    assert loaded.name == warmup_flow.name == "warmup"
    assert loaded.fn is warmup_flow.fn
    assert loaded.parameters == warmup_flow.parameters
    assert isinstance(loaded.task_runner, OrderOnlyDaskTaskRunner)
    original = warmup_flow.task_runner  # untouched: `warmup` still runs on threads
    assert not isinstance(original, OrderOnlyDaskTaskRunner)


def test_what_a_batch_receives_survives_dask_serialisation() -> None:
    """Dask pickles a task's arguments (pickle, else cloudpickle) to send them to a worker
    process: a batch's items and job must come back equal."""
    from distributed.protocol.pickle import dumps, loads

    from models.warmup.items import WarmItem
    from models.warmup.run import BackendSpec, Batch, NodeResources, WarmupJob

    resources = NodeResources(BackendSpec("hf", "/models/tiny"), "/data", "redis://h:6379/0")
    job = WarmupJob(resources, "plan-1", "hf:tiny")
    items = [WarmItem(0, "t", "kv:a", "kv_prefix", None, "memory", "text"),
             WarmItem(1, "t", "kv:b", "kv_prefix", "kv:a", "ssd", None)]  # fmt: skip
    batch = Batch(0, items, (1, 2))
    for value in (resources, job, items, batch):
        assert loads(dumps(value)) == value
    assert loads(dumps(job)).ledger_path == Path("/data/warmup/plan-1.sqlite")


# -- a warm-up on a real cluster --------------------------------------------------------------


class TaskLog(SchedulerPlugin):
    """A scheduler plugin: for each task the scheduler hands to a worker, that worker's
    address and how many Dask dependencies the task had (a dependency pins a task to the
    workers holding its inputs)."""

    name = "preheat-test-task-log"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.started: list[tuple[str, int]] = []

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "processing":
            task = self.scheduler.tasks[key]
            self.started.append((task.processing_on.address, len(task.dependencies)))


@dataclass
class DaskCluster:
    client: Any  # not the default client: the runner must find the scheduler by address
    log: TaskLog

    @property
    def address(self) -> str:
        return str(self.client.scheduler.address)


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[DaskCluster]:
    """Two single-threaded worker processes, as the flow's default LocalCluster has; its
    scheduler runs in this process, so the task log is read directly."""
    from distributed import Client, LocalCluster

    from flows.warmup.dask_flow import local_cluster_kwargs

    with LocalCluster(**local_cluster_kwargs(2)) as cluster, \
            Client(cluster, set_as_default=False) as client:  # fmt: skip
        client.wait_for_workers(2, timeout=120)
        log = TaskLog(cluster.scheduler)
        cluster.scheduler.add_plugin(log)
        yield DaskCluster(client, log)


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hours of generated requests, each prompt behind its tenant's system prompt."""
    return write_warmable_lake(tmp_path_factory.mktemp("dask-lake"))


def executed_per_worker(client: Any) -> dict[int, int]:
    """{worker pid: tasks that worker process has executed}, from each worker's own state."""
    answers = client.run(lambda dask_worker: (os.getpid(), dask_worker.state.executed_count))
    return dict(answers.values())


def assert_parents_finished_first(rows: Any, batch_size: int) -> None:
    """No item of a batch started before every item of the batches it waits for finished
    (the ledger's wall-clock times, written by the worker processes of one host)."""
    from models.warmup.items import WarmItem
    from models.warmup.run import dependency_batches

    items = [WarmItem(r.ord, r.tenant, r.item, r.kind, r.parent, r.tier, r.text)
             for r in rows.itertuples(index=False)]  # fmt: skip
    batches = dependency_batches(items, batch_size)
    times = rows.set_index(["tenant", "item"])
    finished = [times.loc[[i.ident for i in b.items], "finished"].max() for b in batches]
    waits = 0
    for batch in batches:
        started = times.loc[[i.ident for i in batch.items], "started"].min()
        for parent in batch.after:
            assert started >= finished[parent], (batch.index, parent)
            waits += 1
    assert waits > 0  # the plan has dependencies between batches, so this checked something


def assert_cache_holds(rows: Any, data_dir: Path, model_dir: Path) -> None:
    """Every KV item's pages and every embedding, as a new process sees the node's cache."""
    from cache_runtime.node_cache import EMBEDDING_MODEL_ID, node_cache
    from models.llm.backends import HFBackend

    backend = HFBackend.from_path(model_dir)
    cache = node_cache(Settings(data_dir=data_dir), 1 << 20, 2 << 20)
    try:
        kv = rows[rows["kind"] == "kv_prefix"]
        assert len(kv) > 20
        for item in kv.itertuples(index=False):
            keys = page_keys(item.tenant, backend.model_id, backend.encode(item.text))
            assert len(keys) >= 3 and cache.longest_prefix(keys) == len(keys), item.item
        embeddings = rows[rows["kind"] == "embedding"]
        for item in embeddings.itertuples(index=False):
            vector = cache.get(EmbeddingKey.of(item.tenant, EMBEDDING_MODEL_ID, item.text))
            assert vector is not None and len(vector) == 384 * 4
    finally:
        cache.close()
        backend.close()


@pytest.mark.integration
@pytest.mark.slow
def test_dask_warmup_spreads_batches_over_worker_processes_and_a_rerun_does_nothing(
    prefect_api: None, dask_cluster: DaskCluster, lake_dir: Path, model_dir: Path, tmp_path: Path
) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.warmup.dask_flow import dask_task_runner, warmup_on_dask

    data_dir = tmp_path / "data"
    for part in ("lake", "features"):
        shutil.copytree(lake_dir / part, data_dir / part)
    warm = warmup_on_dask(dask_task_runner(dask_cluster.address, 2))
    arguments = {
        "data_dir": str(data_dir), "mlflow_uri": f"sqlite:///{tmp_path / 'none.db'}",
        "model_path": str(model_dir), "batch_size": 4, "node": "dask-node", **BUDGETS,
    }  # fmt: skip
    before = executed_per_worker(dask_cluster.client)
    assert len(before) == 2 and os.getpid() not in before
    logged = len(dask_cluster.log.started)

    state = warm(**arguments, return_state=True)
    assert state.is_completed()
    summary = state.result()
    assert summary["planned"] == summary["done"] == summary["plan"]["planned"] > 20
    assert summary["skipped_already_done"] == summary["failed"] == summary["unresolved"] == 0
    batches = math.ceil(summary["planned"] / 4)
    after = executed_per_worker(dask_cluster.client)
    executed = {pid: after[pid] - before[pid] for pid in after}
    assert sum(executed.values()) == batches  # every batch ran on the cluster, once
    assert all(count > 0 for count in executed.values()), executed  # in both processes
    # ordered by waiting in the flow, not by Dask dependencies, which would pin every batch
    # to the worker that ran batch 0 (all of this plan's batches wait for it)
    assert [deps for _, deps in dask_cluster.log.started[logged:]] == [0] * batches

    with get_client(sync_client=True) as client:  # the workers reported to this API
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            )
        )
        limit = client.read_global_concurrency_limit_by_name("warmup-dask-node")
    warmed = [run for run in runs if run.name.startswith("warm-batch-")]
    assert len(warmed) == batches and all(run.state.is_completed() for run in warmed)
    assert (limit.limit, limit.active_slots) == (2, 0)

    rows = ledger_frame(data_dir, summary["plan_id"], summary["target"])
    assert len(rows) == summary["planned"]
    assert set(rows["state"]) == {"done"} and set(rows["attempts"]) == {1}
    assert_parents_finished_first(rows, batch_size=4)
    assert_cache_holds(rows, data_dir, model_dir)

    again = warm(**arguments, return_state=True)
    assert again.is_completed()
    second = again.result()
    assert second["plan_id"] == summary["plan_id"]
    assert (second["done"], second["skipped_already_done"]) == (0, summary["planned"])
    assert set(ledger_frame(data_dir, summary["plan_id"], summary["target"])["attempts"]) == {1}


@pytest.mark.integration
def test_settled_waits_for_dask_futures_and_keeps_allow_failure(dask_cluster: DaskCluster) -> None:
    """What `OrderOnlyDaskTaskRunner` passes as `wait_for`: final states, not Dask futures
    (which Dask would turn into dependencies), with `allow_failure` still around them."""
    from uuid import uuid4

    from prefect.states import Completed, Failed
    from prefect.utilities.annotations import allow_failure
    from prefect_dask.task_runners import PrefectDaskFuture

    from flows.warmup.dask_flow import settled

    def future(make_state: Any) -> PrefectDaskFuture[Any]:
        dask_future = dask_cluster.client.submit(make_state, pure=False)
        return PrefectDaskFuture(wrapped_future=dask_future, task_run_id=uuid4())

    failed, done = future(Failed), future(Completed)
    out = settled([allow_failure(failed), done, "not a future"])
    assert isinstance(out[0], allow_failure) and out[0].unwrap().is_failed()
    assert out[1].is_completed() and out[2] == "not a future"
    assert failed.state is out[0].unwrap() and done.state is out[1]

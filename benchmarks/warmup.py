"""Warm-up planning speed (issue 7): `plan_warmup` on 100,000 synthetic candidates.

The candidates look like a large deployment's: shared system-prompt KV prefixes (parents) with
many template KV prefixes built on them, plus responses and embeddings of repeated prompts;
Zipf-like predicted hits and budgets that hold roughly a third of what is offered, so every
constraint (tiers, compute, deadline, parents) binds somewhere. Prints one JSON object; the
goal is planning in under 2 s (best of 3 runs, validation included). Under "orchestration":
the milliseconds the `warmup` flow's Prefect machinery adds per warmed item (goal: under 5 ms),
measured with a backend that warms nothing (`measure_orchestration_overhead`), with the
default task runner (threads in the flow's process) and with the Dask runner of
`flows.warmup.dask_flow` (worker processes), side by side.

Usage: python benchmarks/warmup.py [--candidates 100000] [--seed 0] [--repeats 3]
       [--orchestration-items 2000] [--batch-size 32] [--dask-workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from data_contracts import WarmupCandidate
from data_contracts.dtypes import STRING
from models.warmup.plan import Budgets, plan_warmup

GOAL_S = 2.0
TENANTS = 10


def synthetic_candidates(n: int, seed: int = 0) -> pd.DataFrame:
    """`n` candidates: 2% shared parents, 78% template KV prefixes under them, 20% responses
    and embeddings. Seeded: the same (n, seed) gives the same frame."""
    rng = np.random.default_rng(seed)
    n_parent, n_prompt = max(1, n // 50), n // 5
    n_child = n - n_parent - n_prompt
    prompt_kinds = np.where(np.arange(n_prompt) % 2 == 0, "response", "embedding")
    kind = np.concatenate([np.full(n_parent + n_child, "kv_prefix"), prompt_kinds])
    parent_of_child = rng.integers(0, n_parent, n_child)
    tenant = np.concatenate(
        [
            np.arange(n_parent) % TENANTS,
            parent_of_child % TENANTS,
            rng.integers(0, TENANTS, n_prompt),
        ]
    )
    item = np.concatenate(
        [
            np.char.add("kv:prefix:", np.arange(n_parent).astype(str)),
            np.char.add("kv:template:", np.arange(n_child).astype(str)),
            np.char.add("response:p", np.arange(n_prompt).astype(str)),
        ]
    )
    parent = np.concatenate(
        [
            np.full(n_parent, None),
            np.char.add("kv:prefix:", parent_of_child.astype(str)),
            np.full(n_prompt, None),
        ]
    ).astype(object)
    hits = rng.zipf(1.3, n).clip(max=10_000).astype(float) * rng.uniform(0.2, 1.0, n)
    blocks = rng.integers(1, 64, n)
    return WarmupCandidate.validate(
        pd.DataFrame(
            {
                "tenant": pd.Series(np.char.add("tenant-", tenant.astype(str)), dtype=STRING),
                "key": pd.Series(np.char.add("key:", np.arange(n).astype(str)), dtype=STRING),
                "item": pd.Series(item, dtype=STRING),
                "kind": pd.Series(kind, dtype=STRING),
                "parent": pd.Series(parent, dtype=STRING),
                "predicted_hits": hits,
                "latency_saved_s": blocks * 16 * 0.00035,
                "bytes": blocks * 16 * 1024,
                "compute_s": np.where(
                    kind == "response", rng.uniform(0.5, 5.0, n), blocks * 0.0056
                ),
                "fanout": np.where(np.arange(n) < n_parent, rng.integers(2, 80, n), 1),
                "needed_in_s": rng.uniform(0, 1800, n),
                "source": "forecast",
            }
        )
    )


def default_budgets(candidates: pd.DataFrame) -> Budgets:
    """A third of the offered bytes over the three tiers, compute for under half of the
    items' and a deadline just above it: bytes, compute and parents all leave items out."""
    total_bytes = int(candidates["bytes"].sum())
    total_compute = float(candidates["compute_s"].sum())
    return Budgets(
        memory_bytes=total_bytes // 20,
        ssd_bytes=total_bytes // 5,
        redis_bytes=total_bytes // 10,
        compute_s=total_compute / 2.15,
        deadline_s=total_compute / 2,
    )


def measure_planning(n: int, seed: int, repeats: int) -> dict[str, Any]:
    candidates = synthetic_candidates(n, seed)
    budgets = default_budgets(candidates)
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = plan_warmup(candidates, budgets)
        times.append(time.perf_counter() - started)
    assert result is not None
    return {
        "candidates": n,
        "plan_s": round(min(times), 4),
        "planned": int(result.summary["planned"]),
        "goal_s": GOAL_S,
        "goal_met": min(times) < GOAL_S,
        "makespan_s": round(result.summary["makespan_s"], 3),
        "deadline_s": round(budgets.deadline_s, 3),
        "excluded_by_reason": result.summary["excluded_by_reason"],
    }


ORCHESTRATION_GOAL_MS = 5.0


def _null_items(n: int, tag: str) -> list[Any]:
    """`n` independent KV items for the null backend (which warms nothing, instantly)."""
    from models.warmup.items import WarmItem

    return [
        WarmItem(i, "bench", f"kv:{tag}:{i}", "kv_prefix", None, "memory", f"prompt {i}")
        for i in range(n)
    ]


def _resources(directory: Path) -> Any:
    from models.warmup.run import BackendSpec, NodeResources

    return NodeResources(BackendSpec("null"), str(directory), None, 1 << 20, 1 << 20)


def _timed_flow_run(
    items: list[Any], directory: Path, batch_size: int, concurrency: int, runner: Any = None
) -> float:
    """Seconds for one flow run that executes `items` the way `warmup` does (node slots,
    batches as tasks, the ledger), planning left out; measured around the whole call.
    `runner`: the flow's task runner (None: Prefect's default, threads in this process)."""
    from prefect import flow

    from flows.warmup.flow import ensure_node_limit, node_slots, submit_batches
    from models.warmup.run import dependency_batches, open_job, release_resources, summarise_run

    @flow(name="warmup-orchestration-bench", task_runner=runner)
    def run() -> dict[str, Any]:
        opened = open_job(items, _resources(directory))
        occupy = min(concurrency, ensure_node_limit("warmup-bench", concurrency))
        try:
            with node_slots("warmup-bench", occupy):
                submit_batches(dependency_batches(items, batch_size), opened.job, occupy)
        finally:
            release_resources(opened.job.resources)
        return summarise_run(opened)

    started = time.perf_counter()
    summary = run()
    seconds = time.perf_counter() - started
    if summary["done"] != len(items):
        raise RuntimeError(f"the flow warmed {summary['done']} of {len(items)} items")
    return seconds


def _dask_arm(
    items: int, root: Path, batch_size: int, concurrency: int, workers: int
) -> dict[str, Any]:
    """The flow run of `_timed_flow_run` with the Dask runner, two ways.

    Steady state (`flow_s`): on a LocalCluster of `workers` processes started once, reached by
    address, after a first run that lets each worker import the warm-up code and open its
    resources — a deployment on a long-lived cluster (`PREHEAT_DASK_ADDRESS`). Cold
    (`temporary_s`): the runner a deployment gets by default, which starts its own
    LocalCluster for the run and stops it after, so cluster start, worker imports and
    resource opening all count.
    """
    from distributed import LocalCluster

    from flows.warmup.dask_flow import dask_task_runner, local_cluster_kwargs

    started = time.perf_counter()
    with LocalCluster(**local_cluster_kwargs(workers)) as cluster:
        cluster.wait_for_workers(workers, timeout=120)
        cluster_s = time.perf_counter() - started
        runner = dask_task_runner(cluster.scheduler_address, workers)
        first = _null_items(batch_size * workers * 2, "dask-first")  # a batch or more each
        first_s = _timed_flow_run(first, root / "dask-first", batch_size, concurrency, runner)
        flow_s = _timed_flow_run(_null_items(items, "dask"), root / "dask", batch_size,
                                 concurrency, runner)  # fmt: skip
    temporary = dask_task_runner(None, workers)  # a cluster of its own, for this run only
    temporary_s = _timed_flow_run(_null_items(items, "dask-temporary"), root / "dask-temporary",
                                  batch_size, concurrency, temporary)  # fmt: skip
    return {"flow_s": flow_s, "first_s": first_s, "cluster_s": cluster_s,
            "temporary_s": temporary_s}  # fmt: skip


def measure_orchestration_overhead(
    items: int = 2000, batch_size: int = 32, concurrency: int = 2, dask_workers: int = 2
) -> dict[str, Any] | None:
    """Milliseconds of Prefect orchestration per warmed item (goal: under 5 ms), with the
    default task runner and, when `dask_workers` > 0, with the Dask runner.

    The same `items` null-backend items are executed by the plain batch loop the CLI uses
    (`warm_locally`: ledger, cache, no Prefect) and by a flow on a running Prefect API
    (`prefect_test_harness`, started here; one warm-up flow run first, so the measured run
    sees a running server and warm clients, as a deployment's runs do). The difference per
    item is what orchestration costs: flow and task runs, state updates, the node's slots —
    and with Dask, shipping each batch and its Prefect context to a worker process, which
    reports its task run's states to the API itself (`_dask_arm`). Returns None when
    `items` is 0.
    """
    if items <= 0:
        return None
    import os
    import tempfile

    from models.warmup.run import open_job, warm_locally

    with tempfile.TemporaryDirectory(prefix="preheat-bench-") as scratch:
        root = Path(scratch)
        os.environ.setdefault("PREFECT_HOME", str(root / "prefect"))
        for name, value in (("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("DO_NOT_TRACK", "1"),
                            ("PREFECT_LOGGING_LEVEL", "WARNING")):  # fmt: skip
            os.environ.setdefault(name, value)
        work = _null_items(items, "direct")
        started = time.perf_counter()
        direct = warm_locally(open_job(work, _resources(root / "direct")), batch_size)
        direct_s = time.perf_counter() - started
        assert direct["done"] == items
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            first_s = _timed_flow_run(_null_items(batch_size, "first"), root / "first",
                                      batch_size, concurrency)  # fmt: skip
            flow_s = _timed_flow_run(_null_items(items, "flow"), root / "flow", batch_size,
                                     concurrency)  # fmt: skip
            dask = (_dask_arm(items, root, batch_size, concurrency, dask_workers)
                    if dask_workers > 0 else None)  # fmt: skip

    return _overhead_summary(
        items, batch_size, concurrency, dask_workers, (direct_s, flow_s, first_s), dask
    )


def _overhead_summary(
    items: int, batch_size: int, concurrency: int, dask_workers: int,
    timings: tuple[float, float, float], dask: dict[str, float] | None,
) -> dict[str, Any]:  # fmt: skip
    """The measurement's JSON: per-item milliseconds of each arm and of orchestration (a flow's
    minus the plain loop's), against the goal. `timings`: the plain loop's, the flow's and the
    first flow run's."""
    direct_s, flow_s, first_s = timings

    def ms(seconds: float) -> float:
        return round(seconds / items * 1000, 4)

    per_item_ms = (flow_s - direct_s) / items * 1000
    result: dict[str, Any] = {
        "items": items,
        "batch_size": batch_size,
        "concurrency": concurrency,
        "direct_ms_per_item": ms(direct_s),
        "flow_ms_per_item": ms(flow_s),
        "orchestration_ms_per_item": round(per_item_ms, 4),
        "first_flow_run_s": round(first_s, 3),
        "goal_ms": ORCHESTRATION_GOAL_MS,
        "goal_met": per_item_ms < ORCHESTRATION_GOAL_MS,
    }
    if dask is not None:
        dask_ms = (dask["flow_s"] - direct_s) / items * 1000
        result |= {
            "dask_flow_ms_per_item": ms(dask["flow_s"]),
            "dask_orchestration_ms_per_item": round(dask_ms, 4),
            "dask_goal_met": dask_ms < ORCHESTRATION_GOAL_MS,
            "dask": {
                "workers": dask_workers,
                "cluster": "LocalCluster, processes, 1 thread each, 127.0.0.1",
                "cluster_start_s": round(dask["cluster_s"], 3),
                "first_flow_run_s": round(dask["first_s"], 3),
                "temporary_cluster_flow_ms_per_item": ms(dask["temporary_s"]),
                "temporary_cluster_orchestration_ms_per_item": ms(dask["temporary_s"] - direct_s),
            },
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--orchestration-items", type=int, default=2000,
        help="null-backend items for the Prefect overhead measurement (0: skip it)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--dask-workers", type=int, default=2,
        help="worker processes of the Dask arm of the overhead measurement (0: skip it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.candidates < 100 or args.repeats < 1 or args.batch_size < 1:
        parser.error("--candidates must be >= 100, --repeats and --batch-size >= 1")
    if args.dask_workers < 0:
        parser.error("--dask-workers must be >= 0")
    result = measure_planning(args.candidates, args.seed, args.repeats)
    result["orchestration"] = measure_orchestration_overhead(
        args.orchestration_items, args.batch_size, dask_workers=args.dask_workers
    )
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

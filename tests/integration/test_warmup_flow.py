"""The `warmup` flow on a real Prefect API, and an executor killed mid-plan that resumes.

The lake is the generated log with one change: each prompt carries its tenant's system prompt,
as real prompt logs do. The generator's prompt texts stand for their prefix hashes without
that shared head, so without it a KV item's text (what its requests share) would be shorter
than one 16-token page and the page checks below would check nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from helpers import ledger_frame, run_cli, wait_until, write_warmable_lake

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import EmbeddingKey
from cache_runtime.kv_pages import page_keys
from cache_runtime.settings import Settings
from cache_runtime.tiers import RedisTier
from cache_runtime.tiers import redis_client as tier_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORKER = Path(__file__).with_name("warmup_worker.py")
BUDGETS = {"memory_mb": 0.5, "ssd_mb": 1.0, "compute_s": 1.0, "deadline_s": 1.0}


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hours of generated requests, system prompts included, ingested with features."""
    return write_warmable_lake(tmp_path_factory.mktemp("warmup-lake"))


def fresh_data_dir(lake_dir: Path, tmp_path: Path) -> Path:
    """A data dir with the module's lake and features, and no ledger or cache yet."""
    data_dir = tmp_path / "data"
    for part in ("lake", "features"):
        shutil.copytree(lake_dir / part, data_dir / part)
    return data_dir


def pages_of(backend: Any, tenant: str, text: str) -> list[Any]:
    return page_keys(tenant, backend.model_id, backend.encode(text))


def test_shared_text_is_what_every_prompt_starts_with_up_to_a_word() -> None:
    from models.warmup.items import shared_text

    assert shared_text(["You are kind. Sum A", "You are kind. Sub B"]) == "You are kind."
    assert shared_text(["You are kind. Sum", "You are kind. Sum"]) == "You are kind. Sum"
    assert shared_text(["You are kind.", "You are kind. More"]) == "You are kind."
    assert shared_text(["Alpha", "Beta"]) is None and shared_text([]) is None


def test_batches_keep_plan_order_and_wait_only_for_their_parents() -> None:
    from models.warmup.items import WarmItem
    from models.warmup.run import dependency_batches

    def item(order: int, name: str, parent: str | None = None) -> WarmItem:
        return WarmItem(order, "t", name, "kv_prefix", parent, "memory", name)

    items = [item(0, "p"), item(1, "a", "p"), item(2, "q"), item(3, "b", "q"), item(4, "c", "p")]
    batches = dependency_batches(list(reversed(items)), batch_size=2)
    assert [[i.item for i in b.items] for b in batches] == [["p", "a"], ["q", "b"], ["c"]]
    assert [b.after for b in batches] == [(), (), (0,)]  # parent in the same batch: no wait


def test_warmup_flow_warms_every_planned_item_and_a_rerun_does_nothing(
    prefect_api: None, lake_dir: Path, model_dir: Path, tmp_path: Path
) -> None:
    from prefect import get_client

    from cache_runtime.node_cache import EMBEDDING_MODEL_ID, node_cache
    from flows.warmup.flow import warmup_flow
    from models.llm.backends import HFBackend
    from models.warmup.execute import WarmLedger

    data_dir = fresh_data_dir(lake_dir, tmp_path)
    arguments = {
        "data_dir": str(data_dir), "mlflow_uri": f"sqlite:///{tmp_path / 'none.db'}",
        "model_path": str(model_dir), "batch_size": 8, "node": "test-node", **BUDGETS,
    }  # fmt: skip
    state = warmup_flow(**arguments, return_state=True)
    assert state.is_completed()
    summary = state.result()
    assert summary["planned"] == summary["done"] == summary["plan"]["planned"] > 20
    assert summary["skipped_already_done"] == summary["failed"] == summary["unresolved"] == 0
    assert summary["pages_stored"] > 0

    backend = HFBackend.from_path(model_dir)
    rows = ledger_frame(data_dir, summary["plan_id"], summary["target"])
    assert set(rows["state"]) == {"done"} and set(rows["attempts"]) == {1}
    cache = node_cache(Settings(data_dir=data_dir), 1 << 20, 2 << 20)  # a new process's view
    try:
        kv = rows[rows["kind"] == "kv_prefix"]
        assert len(kv) > 20
        texts = dict(zip(kv["item"] + "@" + kv["tenant"], kv["text"], strict=True))
        for item in kv.itertuples(index=False):
            keys = pages_of(backend, item.tenant, item.text)
            assert len(keys) >= 3 and cache.longest_prefix(keys) == len(keys), item.item
            if item.parent is not None:  # the parent's pages are the head of the child's
                parent = pages_of(backend, item.tenant, texts[f"{item.parent}@{item.tenant}"])
                assert keys[: len(parent)] == parent
        for item in rows[rows["kind"] == "embedding"].itertuples(index=False):
            vector = cache.get(EmbeddingKey.of(item.tenant, EMBEDDING_MODEL_ID, item.text))
            assert vector is not None and len(vector) == 384 * 4
    finally:
        cache.close()
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name("warmup-test-node")
    assert (limit.limit, limit.active_slots) == (2, 0)  # created by the run, released after it

    again = warmup_flow(**arguments, return_state=True)
    assert again.is_completed()
    second = again.result()
    assert second["plan_id"] == summary["plan_id"]
    assert (second["done"], second["skipped_already_done"]) == (0, summary["planned"])
    rows = ledger_frame(data_dir, summary["plan_id"], summary["target"])
    assert set(rows["attempts"]) == {1}  # nothing was warmed twice
    assert WarmLedger.path_for(data_dir, summary["plan_id"]).is_file()


def test_a_run_waits_while_the_node_limit_is_full(
    prefect_api: None, lake_dir: Path, tmp_path: Path
) -> None:
    """Another holder of the node's only slot keeps a run from warming anything."""
    from prefect.concurrency.sync import concurrency

    from flows.warmup.flow import ensure_node_limit, warmup_flow

    assert ensure_node_limit("warmup-busy-node", 1) == 1
    data_dir = fresh_data_dir(lake_dir, tmp_path)
    states: list[Any] = []

    def warm() -> None:
        arguments = {"data_dir": str(data_dir), "mlflow_uri": f"sqlite:///{tmp_path / 'none.db'}"}
        states.append(
            warmup_flow(**arguments, backend="null", node="busy-node", return_state=True, **BUDGETS)
        )

    run = threading.Thread(target=warm)
    with concurrency("warmup-busy-node", strict=True):
        run.start()
        wait_until(lambda: any((data_dir / "warmup").glob("*.sqlite")), timeout_s=60)
        run.join(timeout=2.0)  # planned and registered: now it can only wait for the slot
        assert run.is_alive()
        (ledger,) = (data_dir / "warmup").glob("*.sqlite")
        assert ledger_frame(data_dir, ledger.stem, "null")["state"].eq("pending").all()
    run.join(timeout=90)
    assert not run.is_alive() and states[0].is_completed()
    summary = states[0].result()
    assert summary["done"] == summary["planned"] > 0


def test_killed_executor_resumes_without_losing_or_redoing_items(
    lake_dir: Path, model_dir: Path, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """SIGKILL between an item's cache write and its ledger mark; the rerun redoes only it."""
    from models.llm.backends import HFBackend
    from models.warmup.execute import resolve_items
    from models.warmup.plan import Budgets
    from models.warmup.prepare import PlanOptions, plan_from_lake
    from models.warmup.run import BackendSpec, NodeResources, open_job, warm_locally

    data_dir = fresh_data_dir(lake_dir, tmp_path)
    budgets = Budgets(500_000, 1_000_000, 0, 1.0, 1.0)
    prepared = plan_from_lake(data_dir, f"sqlite:///{tmp_path / 'none.db'}", PlanOptions(budgets))
    items = resolve_items(prepared.result.plan, prepared.recent)
    resources = NodeResources(BackendSpec("hf", str(model_dir)), str(data_dir), redis_url,
                              1 << 20, 2 << 20)  # fmt: skip
    opened = open_job(items, resources)
    plan, target = opened.job.plan_id, opened.job.target
    stall_after, marker = 10, tmp_path / "stalled"

    def stalled_after_some() -> bool:
        rows = ledger_frame(data_dir, plan, target)
        return marker.exists() and int((rows["state"] == "done").sum()) == stall_after

    victim = subprocess.Popen(
        [sys.executable, str(WORKER), str(data_dir), plan, str(model_dir), redis_url,
         str(stall_after), str(marker)],
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    try:
        wait_until(stalled_after_some, timeout_s=120)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)

    rows = ledger_frame(data_dir, plan, target)
    idents = rows["item"] + "@" + rows["tenant"]
    done_before = set(idents[rows["state"] == "done"])
    (in_flight,) = rows[rows["state"] == "running"].itertuples(index=False)
    assert len(done_before) == stall_after < len(items)
    backend = HFBackend.from_path(model_dir)  # for page keys
    shared = HybridCache([RedisTier(tier_client(redis_url, socket_timeout_s=5), "preheat")])
    written = pages_of(backend, in_flight.tenant, in_flight.text)
    assert shared.longest_prefix(written) == len(written)  # written, never marked done

    summary = warm_locally(open_job(items, resources), batch_size=8)
    assert (summary["failed"], summary["unresolved"]) == (0, 0)
    assert summary["skipped_already_done"] == stall_after
    assert summary["done"] == len(items) - stall_after
    rows = ledger_frame(data_dir, plan, target)
    assert len(rows) == len(items) and set(rows["state"]) == {"done"}  # none lost
    attempts = dict(zip(rows["item"] + "@" + rows["tenant"], rows["attempts"], strict=True))
    assert all(attempts[item] == 1 for item in done_before)  # done before the kill: not redone
    assert attempts[f"{in_flight.item}@{in_flight.tenant}"] == 2  # the one in flight: once more
    assert sum(attempts.values()) == len(items) + 1
    redo = rows[(rows["item"] == in_flight.item) & (rows["tenant"] == in_flight.tenant)].iloc[0]
    assert redo["pages_stored"] == 0  # its pages had survived the kill: the redo wrote none
    for item in rows[rows["kind"] == "kv_prefix"].itertuples(index=False):
        keys = pages_of(backend, item.tenant, item.text)
        assert shared.longest_prefix(keys) == len(keys), item.item
    shared.close()

    cli = run_cli(
        "warmup", "--json", "--model-path", str(model_dir), "--data-dir", str(data_dir),
        "--memory-mb", "0.5", "--ssd-mb", "1", "--compute-s", "1", "--deadline-s", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    again = orjson.loads(cli.stdout)
    assert (again["plan_id"], again["done"]) == (plan, 0)
    assert again["skipped_already_done"] == len(items)


def test_the_scheduled_warmup_on_an_empty_lake_completes_and_says_why(
    prefect_api: None, tmp_path: Path
) -> None:
    from flows.warmup.flow import warmup_flow
    from models.warmup.prepare import EmptyLake

    arguments = {"data_dir": str(tmp_path / "data"), "backend": "null", "node": "empty-node"}
    assert "no lake under" in warmup_flow(**arguments, skip_if_empty=True)["skipped"]
    with pytest.raises(EmptyLake, match="run `preheat ingest` first"):
        warmup_flow(**arguments)

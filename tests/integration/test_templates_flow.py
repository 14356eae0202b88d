"""`mine-templates` on a real lake and a real MLflow store: table, run, stable ids, the CLI path,
and the session views written beside the table (hotspot graph, intents) and logged to the run.

The task runs as a plain function (`.fn`, house style: a Prefect harness costs ~30 s and adds
nothing the other flow tests do not cover); the embeddings are the real MiniLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mlflow
import orjson
import pandas as pd
import pytest

from data_contracts.lake import lake_of
from data_contracts.templates import read_templates
from models.ingest.pipeline import ingest_file
from models.templates.hotspot import HotspotGraph, graph_path
from models.templates.mined import MinedTemplates
from models.templates.tracking import EXPERIMENT
from models.templates.workload import builtin_corpus, templated_workload

pytestmark = [pytest.mark.integration, pytest.mark.slow]
START = pd.Timestamp("2024-03-04T09:00:00Z")
PARAMS = {"min_support": 5, "top_k": 5, "silhouette_sample": 150, "seed": 0}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    before = mlflow.get_tracking_uri()
    yield f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(before)


def _log(path: Path, tenants: dict[str, int], offset: int = 0) -> Path:
    """A generic-format request log: each tenant's templated workload, labelled."""
    rows = []
    for tenant, seed in tenants.items():
        work = templated_workload(builtin_corpus(), n_prompts=240, n_roles=4, seed=seed)
        for i, (prompt, label) in enumerate(zip(work.prompts, work.labels, strict=True)):
            rows.append(
                {
                    "timestamp": (START + pd.Timedelta(seconds=offset + i)).isoformat(),
                    "tenant": tenant,
                    "request_id": f"{tenant}-{offset + i}",
                    "session_id": f"{tenant}-s{i // 10}",
                    "prompt": prompt,
                    "prompt_tokens": len(prompt.split()),
                    "output_tokens": 10,
                    "template_id": None if label < 0 else f"w{label}",
                }
            )
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def _ingest(tmp_path: Path, log: Path) -> str:
    data_dir = tmp_path / "data"
    report = ingest_file(log, lake_of(data_dir), "jsonl")
    assert report.quarantined == 0
    return str(data_dir)


def test_flow_writes_table_logs_run_and_keeps_ids(tmp_path: Path, store: str) -> None:
    from flows.templates.flow import mine_templates_task

    data_dir = _ingest(tmp_path, _log(tmp_path / "a.jsonl", {"acme": 1, "globex": 2}))
    artifacts = str(tmp_path / "artifacts")
    first = mine_templates_task.fn(data_dir, store, artifacts, PARAMS)
    table = read_templates(Path(data_dir) / "features")
    assert set(table["tenant"]) == {"acme", "globex"} and len(table) == first["templates"]
    for tenant, metrics in first["tenants"].items():
        assert metrics["ari"] >= 0.9, (tenant, metrics)
        assert 0.0 < metrics["coverage"] <= 1.0 and metrics["silhouette"] is not None

    run = mlflow.get_run(first["run_id"])
    assert mlflow.get_experiment(run.info.experiment_id).name == EXPERIMENT
    assert run.info.artifact_uri.startswith((tmp_path / "artifacts").resolve().as_uri())
    assert {"coverage.acme", "ari.globex", "coverage", "templates"} <= run.data.metrics.keys()
    assert run.data.params["method"] == "dbscan"
    top = mlflow.artifacts.load_text(f"{run.info.artifact_uri}/top_templates.csv")
    assert top.splitlines()[0].startswith("template_id,tenant,constant_text")
    _check_sessions(first, run, Path(data_dir))

    # More traffic for acme: the same templates are mined again and keep their ids.
    _ingest(tmp_path, _log(tmp_path / "b.jsonl", {"acme": 5}, offset=10_000))
    second = mine_templates_task.fn(data_dir, store, artifacts, PARAMS)
    after = read_templates(Path(data_dir) / "features")
    before_ids = dict(
        zip(table["tenant"] + table["constant_text"], table["template_id"], strict=True)
    )
    after_ids = dict(
        zip(after["tenant"] + after["constant_text"], after["template_id"], strict=True)
    )
    kept = [key for key in before_ids if key in after_ids]
    assert kept and all(before_ids[key] == after_ids[key] for key in kept)
    assert second["ids_kept"] >= len(kept)

    # The stored table is an assigner: acme's prompts get their mined templates back.
    acme = MinedTemplates.from_frame(after[after["tenant"] == "acme"])
    lake = lake_of(data_dir).read("requests", columns=["tenant", "prompt"])
    prompts = lake[lake["tenant"] == "acme"]["prompt"].tolist()
    assert sum(acme.assign(p) is not None for p in prompts) / len(prompts) > 0.8


def _check_sessions(result: dict, run: mlflow.entities.Run, data_dir: Path) -> None:
    """The hotspot graph and intents of the mined lake: files, run artifacts and metrics."""
    path = graph_path(data_dir / "features")
    graph = HotspotGraph.from_json(path)
    summary = result["hotspot"]
    assert (summary["nodes"], summary["edges"]) == (len(graph.nodes), len(graph.edges))
    assert set(graph.nodes["tenant"]) == {"acme", "globex"}
    assert set(graph.nodes["kind"]) <= {"template", "mined", "phrase"}
    # Sessions are 10 consecutive requests of shuffled templates: the busiest template of each
    # tenant has successors, and they are a distribution over that tenant's nodes.
    for tenant, nodes in graph.nodes.groupby("tenant"):
        busiest = str(nodes.sort_values("volume").iloc[-1]["node"])
        after = graph.follows(str(tenant), busiest, k=len(nodes))
        assert after and sum(p for _, p in after) == pytest.approx(1.0)
        assert {n for n, _ in after} <= set(nodes["node"])
    assert graph.params["min_support"] == PARAMS["min_support"]
    assert (path.parent / "graph.png").read_bytes().startswith(b"\x89PNG")
    intents = orjson.loads((path.parent / "intents.json").read_bytes())
    assert intents["n_sessions"] == summary["n_sessions"] == 2 * 24  # 240 requests, 10 a session
    assert 0.0 <= intents["coverage"] <= 1.0 and intents["clusters"] == len(intents["per_cluster"])

    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "hotspot")}
    assert logged == {"hotspot/graph.json", "hotspot/graph.png", "hotspot/intents.json"}
    metrics = mlflow.get_run(run.info.run_id).data.metrics
    assert metrics["hotspot.nodes"] == len(graph.nodes)
    assert (
        metrics["intents.n_sessions"] == 48 and metrics["intents.coverage"] == intents["coverage"]
    )


def test_cli_path_fails_clearly_on_an_empty_lake(tmp_path: Path, store: str) -> None:
    from cache_runtime.settings import load_settings
    from flows.templates.flow import MineTemplatesParams, mine_templates_now

    settings = load_settings(
        None, data_dir=tmp_path / "empty", mlflow_uri=store, mlflow_artifacts=tmp_path / "art"
    )
    with pytest.raises(LookupError, match="no prompts in the lake"):
        mine_templates_now(settings, MineTemplatesParams())
    with pytest.raises(ValueError, match="method 'kmeans'"):
        MineTemplatesParams(method="kmeans")

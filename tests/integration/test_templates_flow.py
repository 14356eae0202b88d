"""`mine-templates` on a real lake and a real MLflow store: table, run, stable ids, the CLI path.

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

from data_contracts.templates import read_templates
from flows.ingest.flow import lake_of
from flows.ingest.pipeline import ingest_file
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

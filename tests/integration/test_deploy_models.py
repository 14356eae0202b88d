"""`deploy-models` against a real sqlite MLflow store: node manifests, local copies, the record.

One store for the module holds the forecaster (one champion, trained on steady demand) and three
versions of the tiny LLM: 1, 2 (the same model with one weight nudged, so a different
fingerprint) and 3 (one weight all NaN: it loads, and computes garbage). Each test sets the
alias it needs and deploys to its own node, so the tests do not depend on their order.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest

from models.deployment import (
    EXPERIMENT,
    DeploymentFailed,
    deploy_models,
    raise_for_failures,
    resolve_device,
)
from models.node_manifest import (
    DEFAULT_MODELS,
    FORECASTER_MODEL,
    LLM_MODEL,
    MANIFEST,
    deployed_model,
    deployed_tag,
    node_dir,
    node_name,
    read_manifest,
)

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The module's registry: uri, artifacts dir, and the LLM versions by role."""
    from safetensors.torch import load_file, save_file

    from models.llm.registry import register_llm, save_tiny_llm

    before, threads = mlflow.get_tracking_uri(), torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("deploy-store")
    uri, artifacts = f"sqlite:///{root}/mlflow.db", root / "artifacts"
    good = save_tiny_llm(root / "good")
    versions = {"good": register_llm(good, uri, artifacts)}
    for role, change in (("next", lambda t: t + 1e-3), ("broken", lambda t: t * float("nan"))):
        copy = shutil.copytree(good, root / role)
        weights = load_file(copy / "model.safetensors")
        weights["transformer.ln_f.weight"] = change(weights["transformer.ln_f.weight"])
        save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
        versions[role] = register_llm(copy, uri, artifacts)
    assert versions == {"good": "1", "next": "2", "broken": "3"}
    _register_forecaster(uri, artifacts)
    yield {"uri": uri, "artifacts": str(artifacts), **versions}
    mlflow.set_tracking_uri(before)
    torch.set_num_threads(threads)


def _register_forecaster(uri: str, artifacts: Path) -> None:
    """The forecaster test's recipe: steady demand, a 3-epoch attention config, 40 buckets."""
    from data_contracts import DemandSeries
    from models.features.demand import TOTAL_KEY
    from models.forecast.attention import AttentionConfig
    from models.forecast.registry import train_and_register

    start = pd.Timestamp("2024-03-04T00:00:00Z")
    steady = {"acme": {"template:a": 6.0, "template:b": 3.0, TOTAL_KEY: 12.0}}
    rows = [
        (tenant, key, "3min", start + t * pd.Timedelta(minutes=3), count)
        for tenant, keys in steady.items()
        for key, count in keys.items()
        for t in range(40)
    ]
    columns = ["tenant", "key", "granularity", "bucket_start", "count"]
    demand = DemandSeries.validate(pd.DataFrame(rows, columns=columns), lazy=True)
    config = AttentionConfig(epochs=3, context=8, scales=(1, 2, 4), horizon=3)
    result = train_and_register(demand, uri, artifacts, top_k=3, recent=12, config=config)
    assert (result["version"], result["promoted"]) == ("1", True)


def champion_is(store: dict[str, str], role: str) -> str:
    """Point the LLM's `champion` at a version, as a promotion in the MLflow UI would."""
    client = mlflow.MlflowClient(store["uri"])
    client.set_registered_model_alias(LLM_MODEL, "champion", store[role])
    return store[role]


def deploy(store: dict[str, str], data_dir: Path, node: str, **kwargs: object) -> dict:
    outcomes = deploy_models(node, data_dir, store["uri"], store["artifacts"], **kwargs)
    return {o.model: o for o in outcomes}


def tagged(store: dict[str, str], name: str, node: str) -> dict[str, dict]:
    """version -> the `deployed.<node>` tag's value, for the versions that carry it."""
    client = mlflow.MlflowClient(store["uri"])
    tag = deployed_tag(node)
    return {
        str(v.version): json.loads(v.tags[tag])
        for v in client.search_model_versions(f"name = '{name}'")
        if tag in v.tags
    }


def deployment_runs(store: dict[str, str], node: str) -> pd.DataFrame:
    return mlflow.search_runs(
        experiment_names=[EXPERIMENT], filter_string=f"params.node = '{node}'"
    )


def version_dirs(data_dir: Path, node: str, name: str = LLM_MODEL) -> list[str]:
    return sorted(p.name for p in (node_dir(data_dir, node) / "models" / name).iterdir())


def warmup_backend(store: dict[str, str], data_dir: Path, node: str) -> Any:
    from models.warmup.run import BackendSpec, open_backend

    return open_backend(BackendSpec("hf", mlflow_uri=store["uri"]), data_dir, node)


def test_node_names_and_model_names_agree_with_the_rest_of_the_platform() -> None:
    from models.forecast.registry import MODEL_NAME as FORECASTER
    from models.llm.registry import MODEL_NAME as LLM

    assert DEFAULT_MODELS == (FORECASTER_MODEL, LLM_MODEL) == (FORECASTER, LLM)
    assert node_name("gpu 0/rack:1") == "gpu-0-rack-1"
    with pytest.raises(ValueError, match="not a usable node name"):
        node_name("..")


def test_first_deploy_copies_checks_and_records_then_a_rerun_skips(
    store: dict[str, str], tmp_path: Path
) -> None:
    champion_is(store, "good")
    data_dir, node = tmp_path / "data", "node-first"
    outcomes = deploy(store, data_dir, node)
    assert {name: (o.status, o.version) for name, o in outcomes.items()} == {
        FORECASTER_MODEL: ("deployed", "1"), LLM_MODEL: ("deployed", "1"),
    }  # fmt: skip
    assert outcomes[LLM_MODEL].device == DEVICE and outcomes[FORECASTER_MODEL].device == "cpu"
    assert outcomes[LLM_MODEL].seconds["load_seconds"] > 0

    manifest = read_manifest(data_dir, node)
    assert {name: (e.version, e.kind) for name, e in manifest.items()} == {
        FORECASTER_MODEL: ("1", "forecaster"), LLM_MODEL: ("1", "llm"),
    }  # fmt: skip
    llm, llm_path = deployed_model(data_dir, LLM_MODEL, node) or pytest.fail("no LLM deployed")
    assert llm_path.is_relative_to(node_dir(data_dir, node) / "models" / LLM_MODEL / "1")
    assert (llm_path / "config.json").is_file() and (llm_path / "model.safetensors").is_file()
    forecaster_path = node_dir(data_dir, node) / manifest[FORECASTER_MODEL].path
    assert (forecaster_path / "MLmodel").is_file()
    assert version_dirs(data_dir, node) == ["1"] == version_dirs(data_dir, node, FORECASTER_MODEL)

    # Warm-up on that node loads the deployed local copy, not the registry's.
    backend = warmup_backend(store, data_dir, node)
    try:
        assert backend.model_id == llm.model_id and "deployed on node-first" in backend.source
    finally:
        backend.close()

    assert tagged(store, LLM_MODEL, node) == {
        "1": {"device": DEVICE, "deployed_at": llm.deployed_at}
    }
    assert set(tagged(store, FORECASTER_MODEL, node)) == {"1"}
    runs = deployment_runs(store, node)
    assert sorted(runs["params.model"]) == sorted(DEFAULT_MODELS)
    assert set(runs["status"]) == {"FINISHED"} and set(runs["tags.outcome"]) == {"deployed"}
    assert set(runs["params.version"]) == {"1"} and (runs["metrics.load_seconds"] > 0).all()

    again = deploy(store, data_dir, node)
    assert {o.status for o in again.values()} == {"unchanged"}
    assert read_manifest(data_dir, node) == manifest and len(deployment_runs(store, node)) == 2


def test_the_node_defaults_to_this_host_and_its_warmup_worker_loads_the_deployed_llm(
    store: dict[str, str], tmp_path: Path
) -> None:
    """The path a warm-up flow run takes on a node's worker: `shared_resources`, no node given."""
    from models.warmup.run import BackendSpec, NodeResources, release_resources, shared_resources

    champion_is(store, "good")
    data_dir = tmp_path / "data"
    outcome = deploy(store, data_dir, None, models=[LLM_MODEL])[LLM_MODEL]
    assert outcome.node == node_name() and outcome.status == "deployed"
    entry = read_manifest(data_dir)[LLM_MODEL]
    resources = NodeResources(BackendSpec("hf", mlflow_uri=store["uri"]), str(data_dir))
    try:
        backend, _ = shared_resources(resources)
        assert backend.source == f"{LLM_MODEL} version 1 deployed on {node_name()}"
        assert backend.model_id == entry.model_id
    finally:
        release_resources(resources)


def test_a_promotion_reaches_the_node_on_its_next_run(
    store: dict[str, str], tmp_path: Path
) -> None:
    champion_is(store, "good")
    data_dir, node = tmp_path / "data", "node-promote"
    deploy(store, data_dir, node, models=[LLM_MODEL])
    old = read_manifest(data_dir, node)[LLM_MODEL]

    new_version = champion_is(store, "next")
    # Until the node's next deploy run, warm-up keeps filling pages for what the node serves.
    backend = warmup_backend(store, data_dir, node)
    try:
        assert backend.model_id == old.model_id
    finally:
        backend.close()

    outcome = deploy(store, data_dir, node, models=[LLM_MODEL])[LLM_MODEL]
    assert (outcome.status, outcome.version, outcome.previous) == ("deployed", new_version, "1")
    new = read_manifest(data_dir, node)[LLM_MODEL]
    assert new.version == new_version and new.model_id != old.model_id
    assert version_dirs(data_dir, node) == [new_version]  # the old copy is gone
    assert set(tagged(store, LLM_MODEL, node)) == {new_version}  # the tag moved
    backend = warmup_backend(store, data_dir, node)
    try:
        assert backend.model_id == new.model_id
    finally:
        backend.close()
    runs = deployment_runs(store, node)
    latest = runs.sort_values("start_time").iloc[-1]
    assert (latest["params.version"], latest["params.previous_version"]) == (new_version, "1")


def test_a_version_failing_its_check_never_replaces_the_running_one(
    store: dict[str, str], tmp_path: Path
) -> None:
    champion_is(store, "good")
    data_dir, node = tmp_path / "data", "node-broken"
    deploy(store, data_dir, node, models=[LLM_MODEL])
    manifest_bytes = (node_dir(data_dir, node) / MANIFEST).read_bytes()

    broken = champion_is(store, "broken")
    outcome = deploy(store, data_dir, node, models=[LLM_MODEL])[LLM_MODEL]
    assert (outcome.status, outcome.previous) == ("failed", "1")
    assert "non-finite logits" in str(outcome.error)
    assert (node_dir(data_dir, node) / MANIFEST).read_bytes() == manifest_bytes
    assert version_dirs(data_dir, node) == ["1"]  # the staged copy was removed
    assert set(tagged(store, LLM_MODEL, node)) == {"1"}
    failed = deployment_runs(store, node).query("status == 'FAILED'")
    assert list(failed["params.version"]) == [broken]
    assert "non-finite logits" in failed["tags.error"].iloc[0]
    with pytest.raises(DeploymentFailed, match=f"{LLM_MODEL} v{broken} on {node}: .*stayed"):
        raise_for_failures([outcome])


def test_bad_input_fails_in_one_line_before_the_node_changes(
    store: dict[str, str], tmp_path: Path
) -> None:
    champion_is(store, "good")
    data_dir, node, uri = tmp_path / "data", "node-input", store["uri"]
    deploy(store, data_dir, node, models=[LLM_MODEL])
    manifest_bytes = (node_dir(data_dir, node) / MANIFEST).read_bytes()
    with pytest.raises(LookupError, match=f"^no preheat-nope@champion registered in {uri}$"):
        deploy(store, data_dir, node, models=[LLM_MODEL, "preheat-nope"])
    with pytest.raises(LookupError, match=f"^no {LLM_MODEL}@staging registered in {uri}$"):
        deploy(store, data_dir, node, models=[LLM_MODEL], alias="staging")
    missing = f"sqlite:///{tmp_path}/none.db"
    with pytest.raises(LookupError, match="no store there"):
        deploy_models(node, data_dir, missing, store["artifacts"])
    assert not (tmp_path / "none.db").exists()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device"):
            deploy(store, data_dir, node, device="cuda")
    with pytest.raises(ValueError, match="choose auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    assert (node_dir(data_dir, node) / MANIFEST).read_bytes() == manifest_bytes


def test_what_a_killed_run_leaves_is_ignored_then_cleared(
    store: dict[str, str], tmp_path: Path
) -> None:
    """The state a kill mid-download leaves: a half-written `<version>.partial` and a manifest
    temp file. Readers still see the old, complete version; the next run clears the debris."""
    champion_is(store, "good")
    data_dir, node = tmp_path / "data", "node-killed"
    deploy(store, data_dir, node, models=[LLM_MODEL])
    root = node_dir(data_dir, node)
    (root / "models" / LLM_MODEL / "2.partial" / "artifacts").mkdir(parents=True)
    (root / "models" / LLM_MODEL / "2.partial" / "MLmodel").write_text("artifact_path: mod")
    (root / f".{MANIFEST}.12345").write_text('{"models": {')

    entry, path = deployed_model(data_dir, LLM_MODEL, node) or pytest.fail("nothing deployed")
    assert entry.version == "1" and (path / "config.json").is_file()

    champion_is(store, "next")
    outcome = deploy(store, data_dir, node, models=[LLM_MODEL])[LLM_MODEL]
    assert (outcome.status, outcome.version) == ("deployed", store["next"])
    assert version_dirs(data_dir, node) == [store["next"]]
    assert sorted(p.name for p in root.iterdir()) == sorted([".deploy.lock", MANIFEST, "models"])
    # A node wiped by hand: nothing to load locally, so warm-up falls back to the registry.
    shutil.rmtree(root / "models")
    assert deployed_model(data_dir, LLM_MODEL, node) is None


@pytest.mark.slow
def test_the_flow_deploys_both_champions_and_fails_on_an_unknown_model(
    store: dict[str, str], tmp_path: Path, prefect_api: None
) -> None:
    from flows.deploy.flow import deploy_models_flow

    champion_is(store, "good")
    data_dir, node = tmp_path / "data", "node-flow"
    common = dict(
        node=node, data_dir=str(data_dir), mlflow_uri=store["uri"],
        mlflow_artifacts=store["artifacts"],
    )  # fmt: skip
    summary = deploy_models_flow(**common)
    assert (summary["node"], summary["device"]) == (node, DEVICE)
    assert [(m["model"], m["status"]) for m in summary["models"]] == [
        (FORECASTER_MODEL, "deployed"), (LLM_MODEL, "deployed"),
    ]  # fmt: skip
    assert set(read_manifest(data_dir, node)) == set(DEFAULT_MODELS)
    with pytest.raises(LookupError, match="no preheat-nope@champion"):
        deploy_models_flow(**common, models=["preheat-nope"])
    # the scheduled deployment's mode: what is registered deploys, the rest is skipped
    skipped = deploy_models_flow(
        **common, models=["preheat-nope", LLM_MODEL], skip_unregistered=True
    )
    assert [(m["model"], m["status"]) for m in skipped["models"]] == [(LLM_MODEL, "unchanged")]
    nothing = deploy_models_flow(**common, models=["preheat-nope"], skip_unregistered=True)
    assert "no model of ['preheat-nope'] registered" in nothing["skipped"]


def test_a_deploy_in_a_fresh_process_leaves_no_stray_store_in_its_directory(
    store: dict[str, str], tmp_path: Path
) -> None:
    """A worker's flow run starts with MLflow's default tracking URI, which in MLflow 3 is
    ./mlflow.db: loading the forecaster must not create one in the worker's directory."""
    import subprocess
    import sys

    code = (
        "from models.deployment import deploy_models;"
        f"deploy_models('n-fresh', {str(tmp_path / 'data')!r}, {store['uri']!r}, "
        f"{store['artifacts']!r}, models=['{FORECASTER_MODEL}'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()

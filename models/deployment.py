"""Deploying registered models to a serving node: which version runs where, kept on both sides.

A node holds node-local copies under `<data_dir>/nodes/<node>/` and one manifest,
`models.json`, naming the version of each model it runs. The manifest is the node's only truth:
a version directory is trusted once the manifest points at it, and everything else under
`models/` is debris of an interrupted run, removed by the next. Deploying a version:

1. resolve `models:/<name>@<alias>` to a version once, then work by version (the alias may
   move during the run; the next run picks that up);
2. download it to `models/<name>/<version>.partial/`;
3. load it onto the node's device and check that it works (the LLM: a short prefill with finite
   logits; the forecaster: a forecast of its own stored input example);
4. rename the directory to `models/<name>/<version>/`, switch the manifest (an atomic replace),
   and remove the old version's directory;
5. record it in MLflow: the version's tag `deployed.<node>` (removed from every other version)
   and a run in the experiment `preheat-deployments`.

A kill at any step leaves the manifest pointing at the old, complete version. A version that
fails its check never replaces the running one; the attempt is recorded as a FAILED run.

The deploy run proves the version loads and runs on the node's device; the processes that serve
(warm-up, `preheat serve`) load the manifest's local copy themselves (`deployed_model`). The
forecaster always runs on the CPU: its predict path builds CPU tensors, and it is small enough
that a GPU would only add transfers. Rejected: keeping loaded models in the deploy process (a
Prefect flow run ends, and its memory with it) and a symlink `current -> <version>` (a second
truth beside the manifest, and one that MLflow's copy-by-version layout gains nothing from).

The steps' parts live beside this module: `deploy_target` resolves the request (node, device,
versions), `deploy_checks` holds the per-kind checks, `deploy_record` the MLflow record; the
manifest and the node's files are `models.node_manifest`.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from models.deploy_checks import (
    CHECK_PROMPT,
    KINDS,
    check_forecaster,
    check_llm,
    model_kind,
)
from models.deploy_record import EXPERIMENT, log_attempt, reconcile_tags
from models.deploy_target import (
    DeployTarget,
    prepare_deployment,
    registered_models,
    resolve_device,
    resolve_versions,
)
from models.node_manifest import (
    DEFAULT_MODELS,
    FORECASTER_MODEL,
    LLM_MODEL,
    Deployed,
    deployed_model,
    deployed_tag,
    node_dir,
    node_lock,
    node_name,
    read_manifest,
    remove_debris,
    write_manifest,
)

# Re-exported: the flows and tests name models, targets and manifests through this module too.
__all__ = [
    "CHECK_PROMPT",
    "DEFAULT_MODELS",
    "EXPERIMENT",
    "FORECASTER_MODEL",
    "KINDS",
    "LLM_MODEL",
    "DeployOutcome",
    "DeployTarget",
    "Deployed",
    "DeploymentFailed",
    "deploy_model",
    "deploy_models",
    "deployed_model",
    "deployed_tag",
    "node_dir",
    "node_name",
    "prepare_deployment",
    "raise_for_failures",
    "read_manifest",
    "registered_models",
    "resolve_device",
    "resolve_versions",
]  # fmt: skip


class DeploymentFailed(RuntimeError):
    """Some models failed their check; the running versions stayed. One line per model."""


# -- one model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeployOutcome:
    """What deploying one model did. status: "deployed", "unchanged" or "failed"."""

    model: str
    version: str
    status: str
    node: str
    device: str
    previous: str | None = None
    error: str | None = None
    run_id: str | None = None  # the `preheat-deployments` run, when one was logged
    seconds: dict[str, float] = field(default_factory=dict)


def deploy_model(target: DeployTarget, name: str, version: str) -> DeployOutcome:
    """Bring `target.node` to `name` version `version` (see the module docstring for the steps).

    A version that fails to download, load or check is a "failed" outcome, not an exception,
    so the other models still deploy; `raise_for_failures` turns failures into an error.
    """
    import mlflow

    client = mlflow.MlflowClient(target.tracking_uri)
    with node_lock(target.directory):
        manifest = read_manifest(target.data_dir, target.node)
        current = manifest.get(name)
        root = target.directory / "models" / node_name(name)
        remove_debris(target.directory, root, current.version if current else None)
        if current is not None and current.version == version:
            reconcile_tags(client, target.node, current)
            return DeployOutcome(name, version, "unchanged", target.node, current.device)
        previous = current.version if current else None
        staged = root / f"{version}.partial"
        try:
            entry, seconds = _stage_and_check(target, client, name, version, staged)
        except Exception as error:
            shutil.rmtree(staged, ignore_errors=True)
            reason = re.sub(r"\s+", " ", f"{type(error).__name__}: {error}").strip()[:500]
            what = (name, version, previous)
            run_id = log_attempt(target, client, what, {}, reason, target.device)
            outcome = DeployOutcome(name, version, "failed", target.node, target.device)
            return replace(outcome, previous=previous, error=reason, run_id=run_id)
        staged.rename(root / version)
        write_manifest(target.directory, target.node, {**manifest, name: entry})
        if previous is not None:
            shutil.rmtree(root / previous, ignore_errors=True)
    reconcile_tags(client, target.node, entry)
    run_id = log_attempt(target, client, (name, version, previous), seconds, None, entry.device)
    outcome = DeployOutcome(name, version, "deployed", target.node, entry.device)
    return replace(outcome, previous=previous, run_id=run_id, seconds=seconds)


@contextmanager
def _store_of(uri: str) -> Iterator[None]:
    """Resolve `models:/` URIs and the pyfunc loader's store through `uri` inside the block.

    MLflow 3.17 resolves `models:/` through the process's registry URI whatever
    `download_artifacts(tracking_uri=...)` says; unset, that is ./mlflow.db, created in the
    worker's directory. The environment is used, not `mlflow.set_registry_uri`, which would
    stay set for the rest of the process (and its children) after the deploy; an explicit
    `set_tracking_uri`/`set_registry_uri` made elsewhere still wins, as MLflow documents.
    """
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    previous = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, uri))
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stage_and_check(
    target: DeployTarget, client: Any, name: str, version: str, staged: Path
) -> tuple[Deployed, dict[str, float]]:
    """Download into `staged`, load and check; the entry names the files as they will be once
    `staged` is renamed to the version."""
    from mlflow.artifacts import download_artifacts

    started = time.perf_counter()
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    with _store_of(target.tracking_uri):
        # By version, not alias: resolved once at the start of the run.
        download_artifacts(
            f"models:/{name}/{version}", dst_path=str(staged), tracking_uri=target.tracking_uri
        )
        downloaded = time.perf_counter()
        kind = model_kind(staged)
        device = target.device if kind == "llm" else "cpu"  # the forecaster: see the module doc
        checked = check_llm(staged, device) if kind == "llm" else check_forecaster(staged, name)
    final = Path("models") / node_name(name) / version / checked.path.relative_to(staged)
    run_id = str(client.get_model_version(name, version).run_id)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    entry = Deployed(name, version, kind, final.as_posix(), device, at, checked.model_id, run_id)
    seconds = {
        "download_seconds": downloaded - started, "load_seconds": checked.load_seconds,
        "check_seconds": time.perf_counter() - downloaded - checked.load_seconds,
    }  # fmt: skip
    return entry, seconds


# -- all of them ------------------------------------------------------------------------------


def deploy_models(
    node: str | None,
    data_dir: str | Path,
    tracking_uri: str,
    artifacts_dir: str | Path,
    models: Sequence[str] = DEFAULT_MODELS,
    alias: str = "champion",
    device: str = "auto",
) -> list[DeployOutcome]:
    """Deploy every model's `alias` version to the node, one after another (one device).

    Raises:
        LookupError: an unknown model or alias (nothing was changed).
        ValueError: an unusable node name or device (nothing was changed).
    """
    target, versions = prepare_deployment(
        node, data_dir, tracking_uri, artifacts_dir, models, alias, device
    )
    return [deploy_model(target, name, version) for name, version in versions.items()]


def raise_for_failures(outcomes: Sequence[DeployOutcome]) -> None:
    """Raise `DeploymentFailed` naming every model that failed (after the others deployed)."""
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        lines = [f"{o.model} v{o.version} on {o.node}: {o.error}" for o in failed]
        raise DeploymentFailed("; ".join(lines) + " (the running versions stayed)")

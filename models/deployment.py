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
"""

from __future__ import annotations

import json
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

# Re-exported: the flows and tests name models and read manifests through this module too.
__all__ = [
    "DEFAULT_MODELS",
    "FORECASTER_MODEL",
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

EXPERIMENT = "preheat-deployments"
CHECK_PROMPT = "Preheat deploy check: the cache is warm before the first request arrives."
# A Preheat model's kind is the name of its pyfunc artifact (`artifacts={...}` in the
# registries): the model says what it is, so a second LLM under another name deploys too.
KINDS = ("llm", "forecaster")


class DeploymentFailed(RuntimeError):
    """Some models failed their check; the running versions stayed. One line per model."""


def resolve_device(device: str = "auto") -> str:
    """`auto`: CUDA when torch sees it, else the CPU; an explicit CUDA device must exist.

    Raises:
        ValueError: an unknown device, or CUDA asked for where torch sees none.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if re.fullmatch(r"cuda(:\d+)?", device):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: torch sees no CUDA device on this node")
        return device
    raise ValueError(f"device {device!r}: choose auto, cpu, cuda or cuda:N")


# -- resolving and checking -------------------------------------------------------------------


@dataclass(frozen=True)
class DeployTarget:
    """Where and how to deploy, in plain values (task parameters cross processes)."""

    node: str
    data_dir: str
    tracking_uri: str
    artifacts_dir: str
    device: str  # resolved: "cpu", "cuda", "cuda:N"
    alias: str = "champion"

    @property
    def directory(self) -> Path:
        return node_dir(self.data_dir, self.node)


def resolve_versions(tracking_uri: str, names: Sequence[str], alias: str) -> dict[str, str]:
    """The version `<name>@<alias>` points at now, for every name, before anything is changed.

    Raises:
        LookupError: a model or alias that does not exist (one line: model, alias, store).
    """
    import mlflow

    from models.tracking import alias_version

    sqlite_file = tracking_uri.removeprefix("sqlite:///")
    if tracking_uri.startswith("sqlite:///") and not Path(sqlite_file).is_file():
        # Opening it would create an empty store, and leave it behind.
        raise LookupError(f"no {names[0]}@{alias} registered in {tracking_uri} (no store there)")
    client = mlflow.MlflowClient(tracking_uri)
    versions = {}
    for name in names:
        found = alias_version(client, name, alias)
        if found is None:
            raise LookupError(f"no {name}@{alias} registered in {tracking_uri}")
        versions[name] = str(found.version)
    return versions


def registered_models(tracking_uri: str, names: Sequence[str], alias: str) -> list[str]:
    """The names that have an `alias` version now (the scheduled deploy skips the others: a new
    install has no champion yet, and that is not a failure worth a red run every 15 minutes)."""
    present = []
    for name in names:
        try:
            resolve_versions(tracking_uri, [name], alias)
        except LookupError:
            continue
        present.append(name)
    return present


def prepare_deployment(
    node: str | None,
    data_dir: str | Path,
    tracking_uri: str,
    artifacts_dir: str | Path,
    models: Sequence[str] = DEFAULT_MODELS,
    alias: str = "champion",
    device: str = "auto",
) -> tuple[DeployTarget, dict[str, str]]:
    """Everything that can be wrong with the request, found before any file is touched: the
    node name, the device, and every model's version."""
    if not models:
        raise ValueError("no models to deploy")
    target = DeployTarget(
        node_name(node), str(data_dir), tracking_uri, str(artifacts_dir), resolve_device(device),
        alias,
    )  # fmt: skip
    return target, resolve_versions(tracking_uri, list(models), alias)


def _kind(model_dir: Path) -> str:
    from mlflow.models import Model

    artifacts = Model.load(model_dir).flavors.get("python_function", {}).get("artifacts") or {}
    kinds = [key for key in artifacts if key in KINDS]
    if len(kinds) != 1:
        raise ValueError(f"{model_dir}: not a Preheat model (pyfunc artifacts {sorted(artifacts)})")
    return kinds[0]


@dataclass(frozen=True)
class _Checked:
    path: Path  # what the loader takes
    model_id: str | None
    load_seconds: float


def _check_llm(model_dir: Path, device: str) -> _Checked:
    """Load the LLM onto `device` and prefill a short prompt.

    Finite logits are the minimum function: weights that load but compute NaN (a bad
    fine-tune, a truncated conversion) would otherwise warm pages nobody can use.
    """
    import torch
    from mlflow.models import Model

    from models.llm.backends import HFBackend
    from models.llm.registry import ARTIFACT

    flavor = Model.load(model_dir).flavors["python_function"]
    path = model_dir / flavor["artifacts"][ARTIFACT]["path"]
    started = time.perf_counter()
    backend = HFBackend.from_path(path, device=device)
    loaded = time.perf_counter() - started
    try:
        tokens = backend.encode(CHECK_PROMPT)
        ids = torch.tensor([tokens], device=backend.device)  # (1, T)
        with torch.inference_mode():
            logits = backend.model(ids, logits_to_keep=1).logits  # (1, 1, vocab)
        if not bool(torch.isfinite(logits).all()):
            raise ValueError(f"a {len(tokens)}-token prefill on {device} gave non-finite logits")
        return _Checked(path, backend.model_id, loaded)
    finally:
        backend.close()
        del backend
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def _check_forecaster(model_dir: Path, name: str) -> _Checked:
    """Load the forecaster and forecast its own stored input example (a real slice of the
    demand it was trained on): rows come out, and they pass the `KeyForecast` contract."""
    import mlflow.pyfunc
    from mlflow.models import Model

    from models.forecast.registry import Champion

    example = Model.load(model_dir).load_input_example(str(model_dir))
    if example is None:
        raise ValueError(f"{model_dir}: no input example to check the forecaster with")
    started = time.perf_counter()
    model = mlflow.pyfunc.load_model(str(model_dir))
    loaded = time.perf_counter() - started
    champion = Champion(name, "", "", model.unwrap_python_model().meta, model)
    if champion.predict_per_key(example).empty:
        raise ValueError("the forecaster predicted no rows for its own input example")
    return _Checked(model_dir, None, loaded)


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
            _reconcile_tags(client, target.node, current)
            return DeployOutcome(name, version, "unchanged", target.node, current.device)
        previous = current.version if current else None
        staged = root / f"{version}.partial"
        try:
            entry, seconds = _stage_and_check(target, client, name, version, staged)
        except Exception as error:
            shutil.rmtree(staged, ignore_errors=True)
            reason = re.sub(r"\s+", " ", f"{type(error).__name__}: {error}").strip()[:500]
            what = (name, version, previous)
            run_id = _log_attempt(target, client, what, {}, reason, target.device)
            outcome = DeployOutcome(name, version, "failed", target.node, target.device)
            return replace(outcome, previous=previous, error=reason, run_id=run_id)
        staged.rename(root / version)
        write_manifest(target.directory, target.node, {**manifest, name: entry})
        if previous is not None:
            shutil.rmtree(root / previous, ignore_errors=True)
    _reconcile_tags(client, target.node, entry)
    run_id = _log_attempt(target, client, (name, version, previous), seconds, None, entry.device)
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
        kind = _kind(staged)
        device = target.device if kind == "llm" else "cpu"  # the forecaster: see the module doc
        checked = _check_llm(staged, device) if kind == "llm" else _check_forecaster(staged, name)
    final = Path("models") / node_name(name) / version / checked.path.relative_to(staged)
    run_id = str(client.get_model_version(name, version).run_id)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    entry = Deployed(name, version, kind, final.as_posix(), device, at, checked.model_id, run_id)
    seconds = {
        "download_seconds": downloaded - started, "load_seconds": checked.load_seconds,
        "check_seconds": time.perf_counter() - downloaded - checked.load_seconds,
    }  # fmt: skip
    return entry, seconds


# -- the record in MLflow ---------------------------------------------------------------------


def _reconcile_tags(client: Any, node: str, entry: Deployed) -> None:
    """`deployed.<node>` on the running version (value: device and time), on no other.

    Runs on every deploy, "unchanged" included, so a run killed between the manifest switch
    and MLflow (or an MLflow outage then) is repaired by the next one.
    """
    tag = deployed_tag(node)
    value = json.dumps({"device": entry.device, "deployed_at": entry.deployed_at})
    for version in client.search_model_versions(f"name = '{entry.name}'"):
        tags = version.tags or {}
        if str(version.version) == entry.version:
            if tags.get(tag) != value:
                client.set_model_version_tag(entry.name, entry.version, tag, value)
        elif tag in tags:
            client.delete_model_version_tag(entry.name, str(version.version), tag)


def _log_attempt(
    target: DeployTarget,
    client: Any,
    what: tuple[str, str, str | None],
    seconds: dict[str, float],
    error: str | None,
    device: str,
) -> str:
    """One run in `preheat-deployments`: node, model, version, device, the version it replaced
    (or would have), timings; a failed check is a FAILED run whose `error` tag says why."""
    from mlflow.entities import Metric, Param, RunTag

    from models.tracking import experiment_id

    name, version, previous = what
    experiment = experiment_id(EXPERIMENT, target.tracking_uri, Path(target.artifacts_dir))
    run = client.create_run(experiment, run_name=f"{target.node} {name} v{version}")
    params = {
        "node": target.node, "model": name, "version": version, "device": device,
        "alias": target.alias, "previous_version": str(previous),
    }  # fmt: skip
    tags = {"outcome": "failed" if error else "deployed", **({"error": error} if error else {})}
    stamp = int(time.time() * 1000)
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, stamp, 0) for k, v in seconds.items()],
        params=[Param(k, str(v)) for k, v in params.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    client.set_terminated(run.info.run_id, "FAILED" if error else "FINISHED")
    return str(run.info.run_id)


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

"""Prefect flow `deploy-models`: the registered champions -> this node's device and manifest.

Thin by design (house style): `models.deployment` does the resolving, downloading, checking,
the manifest switch and the MLflow record. Each serving node runs a worker on its own work pool,
so a run of this flow deployed for node X runs on node X: the node name defaults to the host
name, and the files land on that host's disk. A model promoted in the MLflow UI (its alias
moved) reaches a node on the node's next run.

Every name and the device are resolved in one task before anything is touched, so a typo fails
the run without changing a node; then one task per model, one after another (they share one
device). A model that fails its check does not stop the others; the run fails after them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from models.deployment import (
    DEFAULT_MODELS,
    DeployOutcome,
    DeployTarget,
    deploy_model,
    prepare_deployment,
    raise_for_failures,
    registered_models,
)


@task(name="resolve-models", cache_policy=NO_CACHE)
def resolve_task(
    node: str | None,
    data_dir: str,
    mlflow_uri: str,
    mlflow_artifacts: str,
    models: list[str],
    alias: str,
    device: str,
) -> tuple[DeployTarget, dict[str, str]]:
    return prepare_deployment(node, data_dir, mlflow_uri, mlflow_artifacts, models, alias, device)


@task(name="deploy-model", cache_policy=NO_CACHE)
def deploy_task(target: DeployTarget, name: str, version: str) -> DeployOutcome:
    return deploy_model(target, name, version)


@flow(name="deploy-models")
def deploy_models_flow(
    node: str | None = None,
    data_dir: str = "data",
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db",
    mlflow_artifacts: str = "mlruns/artifacts",
    models: list[str] | None = None,
    alias: str = "champion",
    device: str = "auto",
    skip_unregistered: bool = False,
) -> dict[str, Any]:
    """Bring this node to the `alias` version of each model (default: the forecaster and
    `preheat-llm`); returns the node, its device and one outcome per model.

    Raises:
        LookupError: an unknown model or alias (no node was changed).
        DeploymentFailed: a model failed its check (its running version stayed).
    """
    logger = get_run_logger()
    names = list(models or DEFAULT_MODELS)
    if skip_unregistered:  # the scheduled deployment: deploy what is registered, skip the rest
        present = registered_models(mlflow_uri, names, alias)
        for name in sorted(set(names) - set(present)):
            logger.warning("no %s@%s registered in %s yet: skipped", name, alias, mlflow_uri)
        if not present:
            return {"node": node, "skipped": f"no model of {names} registered as @{alias} yet"}
        names = present
    target, versions = resolve_task(
        node, data_dir, mlflow_uri, mlflow_artifacts, names, alias, device
    )
    outcomes = []
    for name, version in versions.items():
        outcome = deploy_task(target, name, version)
        logger.info(
            "%s v%s on %s (%s): %s%s", name, version, target.node, outcome.device, outcome.status,
            f" ({outcome.error})" if outcome.error else "",
        )  # fmt: skip
        outcomes.append(outcome)
    raise_for_failures(outcomes)
    return {
        "node": target.node, "device": target.device,
        "models": [asdict(outcome) for outcome in outcomes],
    }  # fmt: skip

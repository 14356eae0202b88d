"""The record of a deploy in MLflow: the `deployed.<node>` tag on the running version, and one
run per attempt in the experiment `preheat-deployments`.

The node's manifest is the truth; this record follows it and is repaired by the next deploy when
a run was killed between the two (`reconcile_tags`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from models.deploy_target import DeployTarget
from models.node_manifest import Deployed, deployed_tag

EXPERIMENT = "preheat-deployments"


def reconcile_tags(client: Any, node: str, entry: Deployed) -> None:
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


def log_attempt(
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

"""Every deployment `preheat serve` registers: which flow, on which work pool, on what schedule.

A deployment is named after the work pool it runs on (`warmup/preheat`, `warmup/gpu-a`), so the
same flow can be deployed to the coordinator and to every serving node, and a trigger names the
node it wants. The coordinator's pool gets the whole pipeline; a serving node's pool gets what
must run on the node itself (warm-up fills the node's memory and SSD tiers; deploy-models loads
the champions onto the node's device).

Parameters are absolute paths: the worker starts each flow run in the project directory
(`working_dir`), but a path that does not depend on it cannot go wrong.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from cache_runtime.settings import ServeSettings, Settings

ENTRYPOINTS = "flows.serve.entrypoints"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: the flow's attribute in `flows.serve.entrypoints`, its schedules
    (`interval_s` and/or `cron`) and default parameters."""

    flow_attr: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    interval_s: int | None = None
    cron: str | None = None
    node_local: bool = False  # also deployed to each serving node's own pool

    @property
    def entrypoint(self) -> str:
        return f"{ENTRYPOINTS}.{self.flow_attr}"


def absolute_sqlite(uri: str, root: Path) -> str:
    """`sqlite:///mlruns/mlflow.db` resolved against `root` (other URIs are left as they are)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((root / uri[len(prefix) :]).resolve())
    return uri


def deployment_specs(
    settings: Settings, root: Path, redis_url: str | None, node: str, pool: str
) -> list[DeploymentSpec]:
    """The coordinator's deployments with the schedules of `settings.serve`."""
    data_dir = str((root / settings.data_dir).resolve())
    mlflow = {
        "mlflow_uri": absolute_sqlite(settings.mlflow_uri, root),
        "mlflow_artifacts": str((root / settings.mlflow_artifacts).resolve()),
    }
    lake = {"data_dir": data_dir}
    specs = [
        *_pipeline_specs(settings.serve, lake, mlflow),
        *_operating_specs(settings.serve, lake, mlflow, redis_url, node, pool),
    ]
    if redis_url is not None:
        specs.insert(1, DeploymentSpec(
            "ingest_stream", "Drain the live request stream (Redis) into the lake.",
            {**lake, "redis_url": redis_url}, interval_s=settings.serve.ingest_interval_s,
        ))  # fmt: skip
    return specs


def _pipeline_specs(
    serve: ServeSettings, lake: dict[str, Any], mlflow: dict[str, str]
) -> list[DeploymentSpec]:
    """From the inbox to the trained models: ingest, features, training, tuning, mining."""
    data_dir = lake["data_dir"]
    return [
        DeploymentSpec(
            "ingest", "Ingest the log files dropped into <data_dir>/inbox (re-reads add nothing).",
            {**lake, "paths": [str(Path(data_dir) / "inbox")]}, interval_s=serve.ingest_interval_s,
        ),
        DeploymentSpec(
            "features", "Rebuild the per-key demand series (5 s, 3 min, 1 h).", lake,
            interval_s=serve.features_interval_s,
        ),
        DeploymentSpec(
            "train_forecaster", "Train, gate and register the demand forecaster.",
            {**lake, **mlflow}, cron=serve.train_forecaster_cron,
        ),
        DeploymentSpec(
            "train_heat_gan",
            "Train the heat-evolution GAN, measure its realism, register; champion if it wins.",
            {**lake, **mlflow}, cron=serve.train_heat_gan_cron,
        ),
        DeploymentSpec(
            "tune_decay", "Tune the heat half-life on the latest requests of the lake.",
            {**lake, **mlflow, "skip_if_empty": True}, interval_s=serve.tune_decay_interval_s,
        ),
        DeploymentSpec(
            "mine_templates", "Mine prompt templates and register them.", {**lake, **mlflow},
            cron=serve.mine_templates_cron,
        ),
    ]  # fmt: skip


def _operating_specs(
    serve: ServeSettings, lake: dict[str, Any], mlflow: dict[str, str], redis_url: str | None,
    node: str, pool: str,
) -> list[DeploymentSpec]:  # fmt: skip
    """What keeps the nodes current: warm-ups (on the interval and ahead of peaks), the drift
    watch that retrains, and the champions' deployment to each node."""
    warm = {
        **lake, "mlflow_uri": mlflow["mlflow_uri"], "redis_url": redis_url, "node": node,
        "skip_if_empty": True,
    }  # fmt: skip
    return [
        DeploymentSpec(
            "warmup" if serve.warmup_runner == "threads" else "warmup_dask",
            "Plan a budgeted warm-up from the forecast and warm this node's cache.",
            warm, interval_s=serve.warmup_interval_s, node_local=True,
        ),
        DeploymentSpec(
            "plan_peak_warmups",
            "Forecast the next day's demand and schedule a warm-up ahead of each peak.",
            {**lake, "lead_s": serve.warmup_peak_lead_s, "warmup_deployment": f"warmup/{pool}"},
            interval_s=serve.peak_planning_interval_s,
        ),
        DeploymentSpec(
            "check_drift",
            "Compare the latest hour with the champion's training window (Evidently); retrain "
            "on drift.",
            {**lake, **mlflow, "retrain_deployment": f"train-forecaster/{pool}"},
            interval_s=serve.drift_interval_s,
        ),
        DeploymentSpec(
            "deploy_models", "Load the champion models onto this node's device.",
            {**lake, **mlflow, "node": node, "skip_unregistered": True},
            interval_s=serve.deploy_models_interval_s,
            node_local=True,
        ),
    ]  # fmt: skip


def _schedules(spec: DeploymentSpec, timezone: str) -> list[Any]:
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

    schedules: list[Any] = []
    if spec.interval_s is not None:
        schedules.append(IntervalSchedule(interval=timedelta(seconds=spec.interval_s)))
    if spec.cron is not None:
        schedules.append(CronSchedule(cron=spec.cron, timezone=timezone))
    return schedules


def ensure_process_pool(name: str) -> None:
    """Create the process work pool `name` unless it exists (a pool is the operator's once made)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return
        except ObjectNotFound:
            pass
        template = ProcessWorker.get_default_base_job_template()
        with suppress(ObjectAlreadyExists):  # another node created it meanwhile
            client.create_work_pool(
                WorkPoolCreate(name=name, type="process", base_job_template=template)
            )


def register(
    specs: list[DeploymentSpec], pool: str, root: Path, timezone: str = "UTC"
) -> dict[str, str]:
    """Create or update each deployment on `pool`; returns {"flow/deployment": id}.

    Re-registering updates schedules and parameters in place (same name, same id), so `preheat
    serve` can run again after a settings change without duplicating anything.
    """
    import importlib

    from prefect.deployments.runner import EntrypointType

    entrypoints = importlib.import_module(ENTRYPOINTS)
    ensure_process_pool(pool)
    registered: dict[str, str] = {}
    for spec in specs:
        flow = getattr(entrypoints, spec.flow_attr)
        deployment = flow.to_deployment(
            name=pool, description=spec.description, parameters=spec.parameters,
            schedules=_schedules(spec, timezone), work_pool_name=pool,
            job_variables={"working_dir": str(root.resolve())},
            entrypoint_type=EntrypointType.MODULE_PATH, tags=["preheat"],
        )  # fmt: skip
        # to_deployment derives the entrypoint from the decorated function's module; the worker
        # must import the object with the deployments' retry policy instead.
        deployment.entrypoint = spec.entrypoint
        registered[f"{flow.name}/{pool}"] = str(deployment.apply(work_pool_name=pool))
    return registered


def describe_deployments() -> list[dict[str, Any]]:
    """The deployments as the Prefect API reports them: name, pool, schedules, entrypoint."""
    from prefect import get_client

    rows = []
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        for dep in client.read_deployments():
            schedules = []
            for item in dep.schedules:
                sched = item.schedule
                if getattr(sched, "interval", None) is not None:
                    schedules.append(f"every {int(sched.interval.total_seconds())} s")
                elif getattr(sched, "cron", None) is not None:
                    schedules.append(f"cron {sched.cron} {sched.timezone or 'UTC'}")
                else:
                    schedules.append(str(sched))
            rows.append({
                "name": f"{flows.get(dep.flow_id, '?')}/{dep.name}",
                "work_pool": dep.work_pool_name,
                "schedules": schedules,
                "active": not dep.paused,
                "entrypoint": dep.entrypoint,
            })  # fmt: skip
    return sorted(rows, key=lambda row: row["name"])

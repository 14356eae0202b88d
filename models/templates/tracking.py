"""MLflow logging of template minings: one run per mining, experiment `preheat-templates`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

EXPERIMENT = "preheat-templates"
METRICS = ("coverage", "clusters", "silhouette", "ari", "nmi", "templates", "prompts")


def log_mining_run(
    params: dict[str, Any],
    metrics: dict[str, dict[str, Any]],
    top: pd.DataFrame,
    tracking_uri: str,
    artifacts_dir: Path,
) -> str:
    """Log the knobs, each tenant's quality and the top-K table; returns the run id.

    Metrics are named `<metric>.<tenant>`, plus `coverage` and `templates` over all tenants
    (weighted by prompts), so the MLflow UI can chart a tenant across minings.
    """
    import mlflow

    from models.tracking import experiment_id as get_experiment

    experiment_id = get_experiment(EXPERIMENT, tracking_uri, artifacts_dir)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_params({**params, "tenants": len(metrics)})
        for tenant, values in metrics.items():
            for name in METRICS:
                if values.get(name) is not None:
                    mlflow.log_metric(f"{name}.{tenant}", float(values[name]))
        prompts = sum(v["prompts"] for v in metrics.values())
        if prompts:
            covered = sum(v["coverage"] * v["prompts"] for v in metrics.values())
            mlflow.log_metric("coverage", covered / prompts)
        mlflow.log_metric("templates", sum(v["templates"] for v in metrics.values()))
        table = top.assign(mined_at=top["mined_at"].astype(str))
        mlflow.log_text(table.to_csv(index=False), "top_templates.csv")
        mlflow.log_dict({"metrics": metrics, "params": params}, "mining.json")
        return run.info.run_id

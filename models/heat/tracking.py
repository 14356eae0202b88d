"""MLflow logging of decay-tuning runs: one run per tuning, experiment `preheat-decay-tuning`.

The priority weight is logged (per round and for best / default / grid optimum) only when it was
searched: on a window of one priority it has no value to log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXPERIMENT = "preheat-decay-tuning"


def log_tuning_run(
    result: dict[str, Any], tracking_uri: str, artifacts_dir: Path, trace: str
) -> str:
    """Log parameters, the per-round objective and the full result JSON; returns the run id."""
    import mlflow

    from models.tracking import experiment_id as get_experiment

    experiment_id = get_experiment(EXPERIMENT, tracking_uri, artifacts_dir)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_params(
            {
                "trace": trace,
                "capacity_entries": result["capacity"],
                "rounds": len(result["rounds"]),
                "priority_weight_searched": result["priority_weight"] is not None,
                **{f"latency.{k}": v for k, v in result["latency_model"].items()},
            }
        )
        for step, round_ in enumerate(result["rounds"]):
            mlflow.log_metric("objective", round_["objective"], step=step)
            if round_["priority_weight"] is not None:
                mlflow.log_metric("priority_weight", round_["priority_weight"], step=step)
        for name in ("best", "default", "grid_optimum"):
            mlflow.log_metric(f"{name}_objective", result[name]["objective"])
            mlflow.log_metric(f"{name}_half_life_s", result[name]["half_life_s"])
            if result[name]["priority_weight"] is not None:  # None: not searched (one priority)
                mlflow.log_metric(f"{name}_priority_weight", result[name]["priority_weight"])
        mlflow.log_metric("objective_range_over_grid", result["objective_range_over_grid"])
        mlflow.log_dict(result, "tuning.json")
        return run.info.run_id

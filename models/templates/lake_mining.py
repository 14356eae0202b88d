"""Mining the lake's prompts into `features/templates.parquet`, with the hotspot analysis, logged
to one MLflow run.

`mine_lake` reads the lake and the previous templates table, calls
`models.templates.tenants.mine_tenants` (per tenant, ids kept stable against the previous table),
writes the table with its contract and logs the run. The table is a derived file like the demand
features rather than a lake table: a re-mining replaces a tenant's templates, which the lake's
append-only, deduplicated tables are built not to do.

After the mining, `models.templates.intents.analyse_sessions` builds the hotspot graph and the
cross-session intents from the same requests (the new templates name the prompts the log gave no
template id) into `features/hotspot/` (`graph.json`, `graph.png`, `intents.json`), logged to the
same MLflow run under `hotspot/` with the `intents.*` and `hotspot.*` metrics. A lake whose
requests have no session structure to show (no node at all) skips them and says why. No Prefect
here: the `mine-templates` flow (`flows.templates.flow`) runs it as its task.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from data_contracts.lake import lake_of
from data_contracts.templates import read_templates, write_templates
from models.templates.clustering import METHODS


@dataclass(frozen=True)
class MineTemplatesParams:
    """What a user may choose from the CLI or the Prefect UI."""

    min_support: int = 5
    eps: float = 0.35
    method: str = "dbscan"
    top_k: int = 20
    max_prompts: int = 50_000
    silhouette_sample: int = 1_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.min_support < 2 or self.top_k < 1 or self.max_prompts < 1:
            raise ValueError("min_support must be >= 2, top_k and max_prompts >= 1")
        if not 0.0 < self.eps < 1.0:
            raise ValueError("eps is a cosine distance in (0, 1)")


def mine_lake(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, chosen: MineTemplatesParams
) -> dict[str, Any]:
    """Mine each tenant's templates, write the table, analyse the sessions, log the run; returns
    the table's path, the run id, the counts and each tenant's metrics."""
    from models.templates.mining import MiningConfig
    from models.templates.tenants import mine_tenants
    from models.templates.tracking import log_mining_run

    requests = lake_of(data_dir).read(
        "requests", columns=["timestamp", "tenant", "session_id", "prompt", "template_id"]
    )
    if requests["prompt"].notna().sum() == 0:
        raise LookupError(f"no prompts in the lake under {data_dir}: run `preheat ingest` first")
    features = Path(data_dir) / "features"
    previous = read_templates(features)
    config = MiningConfig(min_support=chosen.min_support, eps=chosen.eps, method=chosen.method)
    result = mine_tenants(
        requests, previous, pd.Timestamp.now(tz="UTC"), config,
        top_k=chosen.top_k, max_prompts=chosen.max_prompts,
        silhouette_sample=chosen.silhouette_sample, seed=chosen.seed,
    )  # fmt: skip
    path = write_templates(features, result.table)
    kept = _keys(previous) & _keys(result.table)
    run_id = log_mining_run(
        asdict(chosen), result.metrics, result.top, mlflow_uri, Path(mlflow_artifacts)
    )
    sessions = _sessions(requests, result.table, features, chosen, (mlflow_uri, run_id))
    return {
        "path": str(path),
        "run_id": run_id,
        "templates": len(result.table),
        "ids_kept": len(kept),
        "tenants": result.metrics,
        "hotspot": sessions,
    }


def _sessions(
    requests: pd.DataFrame,
    templates: pd.DataFrame,
    features: Path,
    chosen: MineTemplatesParams,
    run: tuple[str, str],
) -> dict[str, Any]:
    """The hotspot graph and intents of the mined requests, logged to the mining's run
    (`run` = tracking URI, run id; through the client, which leaves the finished run as it is)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from models.templates.embeddings import shared_embedder
    from models.templates.hotspot import HotspotConfig, NoSessionNodes, graph_path
    from models.templates.intents import IntentConfig, analyse_sessions

    graph_config = HotspotConfig(min_support=chosen.min_support)
    intent_config = IntentConfig(
        eps=chosen.eps, min_samples=chosen.min_support,
        silhouette_sample=chosen.silhouette_sample, seed=chosen.seed,
    )  # fmt: skip
    try:
        analysis = analyse_sessions(
            requests, templates, graph_path(features).parent, shared_embedder().embed,
            graph_config, intent_config, max_requests=chosen.max_prompts,
        )  # fmt: skip
    except NoSessionNodes as err:  # no template id and no frequent phrase: nothing to show
        return {"skipped": str(err)}
    summary = analysis.summary()
    client, run_id = MlflowClient(run[0]), run[1]
    for path in analysis.paths.values():
        client.log_artifact(run_id, str(path), artifact_path="hotspot")
    values = {**analysis.report.metrics(), "hotspot.nodes": summary["nodes"]}
    values["hotspot.edges"] = summary["edges"]
    stamp = int(pd.Timestamp.now(tz="UTC").timestamp() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in values.items()])
    return summary


def _keys(table: pd.DataFrame) -> set[tuple[str, str]]:
    return set(zip(table["tenant"], table["template_id"], strict=True))

"""The flows as deployments run them: the same flows, with the deployments' retry policy.

A process worker imports a deployment's entrypoint by module path (`flows.serve.entrypoints.X`)
in the flow run's own process, so the policy is read from the settings (environment, then
`preheat.toml`) of the node that runs the flow. Flows called directly (the CLI, the demo, tests)
keep failing fast: only scheduled or triggered runs retry.

Prefect retries a flow after a fixed delay; the tasks inside back off on their own (warm-up
batches after 2 s then 10 s, ingest files after 5 s), so a failing dependency sees growing gaps.

Each attribute imports only its own flow's module, on first access (PEP 562 `__getattr__`;
Prefect reads a module-path entrypoint with `getattr`). Importing every flow cost each flow
run's process 9.2 s where the ingest flow alone takes 3.1 s and model deployment 1.5 s
(`python -c "import ..."` on the 2-core development machine, 2026-12-06): a triggered run
started that much later, and `tests/integration/test_serve.py` paid it on every run.

Wiring without a Prefect import of its own: the flows it imports bring Prefect; it only gives
each the deployments' retry policy (`with_options`).
"""

from __future__ import annotations

import importlib
from typing import Any

from cache_runtime.settings import load_settings

# attribute -> (module, the flow object in it); warmup_dask is the same flow, batches on Dask
FLOWS: dict[str, tuple[str, str]] = {
    "ingest": ("flows.ingest.flow", "ingest_flow"),
    "ingest_stream": ("flows.ingest.flow", "ingest_stream_flow"),
    "features": ("flows.features.flow", "features_flow"),
    "train_forecaster": ("flows.forecast.flow", "train_forecaster_flow"),
    "train_heat_gan": ("flows.heat.flow", "train_heat_gan_flow"),
    "tune_decay": ("flows.tuning.flow", "tune_decay_flow"),
    "mine_templates": ("flows.templates.flow", "mine_templates_flow"),
    "warmup": ("flows.warmup.flow", "warmup_flow"),
    "warmup_dask": ("flows.warmup.dask_flow", "warmup_dask_flow"),
    "plan_peak_warmups": ("flows.serve.peaks", "plan_peak_warmups_flow"),
    "deploy_models": ("flows.deploy.flow", "deploy_models_flow"),
    "check_drift": ("flows.drift.flow", "check_drift_flow"),
}


def __getattr__(name: str) -> Any:
    """The flow `name` with the deployments' retry policy, imported on first access."""
    if name not in FLOWS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = FLOWS[name]
    policy = load_settings().serve
    flow = getattr(importlib.import_module(module), attr).with_options(
        retries=policy.flow_retries, retry_delay_seconds=policy.flow_retry_delay_s
    )
    globals()[name] = flow  # later accesses find it without this call
    return flow


def __dir__() -> list[str]:
    return sorted({*globals(), *FLOWS})  # a set: a flow already loaded is in both

"""The flows as deployments run them: the same flows, with the deployments' retry policy.

A process worker imports a deployment's entrypoint by module path (`flows.serve.entrypoints.X`)
in the flow run's own process, so the policy is read from the settings (environment, then
`preheat.toml`) of the node that runs the flow. Flows called directly (the CLI, the demo, tests)
keep failing fast: only scheduled or triggered runs retry.

Prefect retries a flow after a fixed delay; the tasks inside back off on their own (warm-up
batches after 2 s then 10 s, ingest files after 5 s), so a failing dependency sees growing gaps.

Wiring without a Prefect import of its own: the flows it imports bring Prefect; it only gives
each the deployments' retry policy (`with_options`).
"""

from __future__ import annotations

from cache_runtime.settings import load_settings
from flows.deploy.flow import deploy_models_flow
from flows.drift.flow import check_drift_flow
from flows.features.flow import features_flow
from flows.forecast.flow import train_forecaster_flow
from flows.heat.flow import train_heat_gan_flow
from flows.ingest.flow import ingest_flow, ingest_stream_flow
from flows.serve.peaks import plan_peak_warmups_flow
from flows.templates.flow import mine_templates_flow
from flows.tuning.flow import tune_decay_flow
from flows.warmup.dask_flow import warmup_dask_flow
from flows.warmup.flow import warmup_flow

_policy = load_settings().serve
_retry = {"retries": _policy.flow_retries, "retry_delay_seconds": _policy.flow_retry_delay_s}

ingest = ingest_flow.with_options(**_retry)
ingest_stream = ingest_stream_flow.with_options(**_retry)
features = features_flow.with_options(**_retry)
train_forecaster = train_forecaster_flow.with_options(**_retry)
train_heat_gan = train_heat_gan_flow.with_options(**_retry)
tune_decay = tune_decay_flow.with_options(**_retry)
mine_templates = mine_templates_flow.with_options(**_retry)
warmup = warmup_flow.with_options(**_retry)
warmup_dask = warmup_dask_flow.with_options(**_retry)  # the same flow, batches on Dask
plan_peak_warmups = plan_peak_warmups_flow.with_options(**_retry)
deploy_models = deploy_models_flow.with_options(**_retry)
check_drift = check_drift_flow.with_options(**_retry)

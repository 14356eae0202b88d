"""Start a deployment from code or the CLI, optionally waiting for its final state.

From Python this is Prefect's own call; `trigger` only adds the name resolution and the
parameter parsing the CLI needs:

    from prefect.deployments import run_deployment
    run = run_deployment("warmup/preheat", parameters={"compute_s": 30}, timeout=600)
    assert run.state.is_completed()
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class TriggerError(ValueError):
    """A bad deployment name or parameter; the message is one line for the user."""


def deployment_name(flow: str, default_pool: str) -> str:
    """`warmup` means the warm-up of the default pool (`warmup/<pool>`); `warmup/gpu-a` is as is.

    Entrypoint attribute spellings (`train_forecaster`) are accepted for flow names
    (`train-forecaster`), since both appear in the docs and the UI.
    """
    name = flow.strip()
    if not name or name.count("/") > 1 or name.startswith("/") or name.endswith("/"):
        raise TriggerError(f"deployment {flow!r}: expected FLOW or FLOW/DEPLOYMENT")
    if "/" not in name:
        name = f"{name}/{default_pool}"
    flow_name, deployment = name.split("/")
    return f"{flow_name.replace('_', '-')}/{deployment}"


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """`k=v` pairs; a value that parses as JSON (numbers, true, null, lists) is taken as such,
    anything else is a string (`--param node=gpu-a`, `--param compute_s=30`)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise TriggerError(f"--param {pair!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            params[key.strip()] = raw
    return params


@dataclass(frozen=True)
class TriggerResult:
    flow_run_id: str
    flow_run_name: str
    deployment: str
    state: str  # the state's type: SCHEDULED (not waited for), COMPLETED, FAILED, ...
    message: str | None
    ui_url: str | None

    @property
    def failed(self) -> bool:
        return self.state in {"FAILED", "CRASHED", "CANCELLED", "CANCELLING"}

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "failed": self.failed}


def trigger(
    name: str, parameters: dict[str, Any], wait: bool, timeout_s: float, ui_base: str | None
) -> TriggerResult:
    """Create a run of deployment `name`; with `wait`, poll until it reaches a final state.

    Raises:
        TriggerError: the deployment does not exist or a parameter is not one of its flow's.
        TimeoutError: `wait` and the run is not final within `timeout_s`.
    """
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    from flows.serve.deployments import describe_deployments

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            known = [row["name"] for row in describe_deployments()]
            raise TriggerError(
                f"no deployment {name!r}; known: {', '.join(known) or 'none (is serve running?)'}"
            ) from None
    accepted = set((deployment.parameter_openapi_schema or {}).get("properties", {}))
    unknown = sorted(set(parameters) - accepted) if accepted else []
    if unknown:
        raise TriggerError(
            f"{name}: unknown parameter(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(sorted(accepted))}"
        )
    run = run_deployment(
        name, parameters=parameters, timeout=timeout_s if wait else 0, poll_interval=1
    )
    state = run.state
    if wait and (state is None or not state.is_final()):
        raise TimeoutError(f"{name}: run {run.name} not finished after {timeout_s:.0f} s")
    return TriggerResult(
        flow_run_id=str(run.id), flow_run_name=run.name, deployment=name,
        state=state.type.value if state else "UNKNOWN", message=state.message if state else None,
        ui_url=f"{ui_base}/runs/flow-run/{run.id}" if ui_base else None,
    )  # fmt: skip

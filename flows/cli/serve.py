"""`preheat serve` and `preheat trigger` (issue 8): the platform running itself in the UIs."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import (
    CliError,
    ConfigOption,
    DataDirOption,
    settings_from,
    stderr,
    write_json,
)

EXIT_RUN_FAILED = 1


def serve_command(
    pool: Annotated[
        str | None,
        typer.Option(help="Work pool for this node's worker (default: [serve] work_pool)."),
    ] = None,
    worker_only: Annotated[
        bool,
        typer.Option(
            "--worker-only", help="Serving node: only a worker on --pool, against --api-url."
        ),
    ] = False,
    api_url: Annotated[
        str | None,
        typer.Option(help="The coordinator's Prefect API, e.g. http://coordinator:4200/api."),
    ] = None,
    node: Annotated[
        str | None, typer.Option(help="This node's name (default: the host name).")
    ] = None,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Prefect server + process worker + deployments with schedules + MLflow UI + Redis."""
    from flows.serve.run import ServeError, ServeOptions, ServeState, serve

    settings = settings_from(config, data_dir)
    if worker_only and not pool:
        raise CliError("--worker-only needs this node's own --pool (and --api-url of the "
                       "coordinator when it runs elsewhere)")  # fmt: skip
    pool = pool or settings.serve.work_pool
    options = ServeOptions(
        root=Path.cwd(), pool=pool, node=node or socket.gethostname(),
        worker_only=worker_only, api_url=api_url,
    )  # fmt: skip

    def ready(state: ServeState) -> None:
        if state.prefect_ui:
            print(f"Prefect UI: {state.prefect_ui}", flush=True)
        if state.mlflow_ui:
            print(f"MLflow UI:  {state.mlflow_ui}", flush=True)
        stderr.print(
            f"worker {state.node!r} on pool {state.pool!r}; {len(state.deployments)} deployments; "
            f"ready in {state.ready_s:.1f} s; Ctrl-C stops everything"
        )

    try:
        code = serve(settings, options, lambda m: stderr.print(m), ready)
    except ServeError as err:
        raise CliError(str(err), code=EXIT_RUN_FAILED) from None
    raise typer.Exit(code)


def trigger_command(
    flow: Annotated[str, typer.Argument(help="FLOW (on the default pool) or FLOW/DEPLOYMENT.")],
    param: Annotated[
        list[str] | None, typer.Option("--param", help="KEY=VALUE (JSON values parsed); repeat.")
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Wait for the final state; exit 1 unless COMPLETED.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 3600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    config: ConfigOption = None,
) -> None:
    """Start a run of a deployment (as the Prefect UI's "Quick run" does)."""
    import httpx

    from flows.serve.run import ServeState, prefect_api, serve_dir
    from flows.serve.trigger import TriggerError, deployment_name, parse_params, trigger

    settings = settings_from(config, None)
    state = ServeState.load(serve_dir(settings, Path.cwd()) / f"{settings.serve.work_pool}.json")
    serve = settings.serve
    api_url = state.prefect_api if state else f"http://{serve.host}:{serve.prefect_port}/api"
    ui_base = state.prefect_ui if state else f"http://{serve.host}:{serve.prefect_port}"
    try:
        name = deployment_name(flow, serve.work_pool)
        params = parse_params(param or [])
        with prefect_api(api_url):
            result = trigger(name, params, wait, timeout, ui_base)
    except TriggerError as err:
        raise CliError(str(err)) from None
    except TimeoutError as err:
        raise CliError(str(err), code=EXIT_RUN_FAILED) from None
    except httpx.HTTPError as err:  # nothing listens at the API address
        raise CliError(f"cannot reach the Prefect API at {api_url} ({err}); is `preheat serve` "
                       "running?") from None  # fmt: skip
    if as_json:
        write_json(result.as_dict())
    else:
        print(f"{result.deployment}: run {result.flow_run_name} {result.state}"
              + (f" ({result.message})" if result.failed and result.message else ""))  # fmt: skip
        if result.ui_url:
            stderr.print(result.ui_url)
    if wait and result.state != "COMPLETED":
        raise typer.Exit(EXIT_RUN_FAILED)

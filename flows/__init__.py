"""Wiring only: Prefect flows and tasks, deployments, the CLI (`flows/cli/`), the demo, and the
gateway's HTTP layer, over `models` and `cache_runtime`."""

"""Prefect flows and tasks, the CLI and the demo: thin wiring over `models` and `cache_runtime`."""

"""The serving-side library: embedded in gateways, so it imports no Prefect, MLflow or Lightning.

Today: settings, the embedded redis-server, the request-log producer and chained prefix hashes.
"""

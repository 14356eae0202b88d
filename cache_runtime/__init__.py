"""The serving-side library: embedded in gateways, so it imports no Prefect, MLflow or Lightning.

Keys and generations, the tiers and `HybridCache`, eviction policies and the policy simulator,
KV pages, heat scoring, settings, the embedded redis-server and supervised child processes, the
request-log stream, the node's cache factory, trace readers and tracing, and the gateway's
model-free serving pieces (`serving/`). torch is needed only by the KV-page code.
"""

from cache_runtime.compiled import check_fresh

check_fresh()

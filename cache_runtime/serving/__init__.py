"""The gateway's model-free serving pieces: what checks and counts a request, no model needed.

Request schemas and the gateway's one error type (`schemas`), API keys and tenants (`auth`),
body size and per-tenant model slots (`limits`), the Prometheus metric definitions (`metrics`),
the time windows derived metrics are computed over (`windows`), the warm-up ledgers' reader
(`warmed`), the node's memory (`system`) and `GatewayConfig` (`config`). What needs the models
(the lookup chain, runners, semantic entries, embeddings, savings, forecast error, signals, the
service and its assembly) is `models/serving/`; the HTTP layer is `flows/gateway/`.
"""

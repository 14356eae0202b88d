"""Everything that learns or decides: ingest, features, forecasting, templates and semantic keys,
heat, warm-up planning and execution, the gateway's serving logic, evaluation (replay, benches),
and the MLflow tracking and registry helpers."""

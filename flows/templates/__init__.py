"""Prefect flow `mine-templates`: the lake's prompts -> templates table + MLflow run."""

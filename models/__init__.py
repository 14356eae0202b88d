"""Lightning modules, training and evaluation code, and MLflow registry helpers (open issues)."""

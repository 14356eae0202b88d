"""Training the demand forecaster on the lake and registering it in MLflow."""

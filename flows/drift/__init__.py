"""Drift of the request stream against the forecaster's training data; retraining on drift."""

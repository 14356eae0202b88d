"""Warm-up: build candidates from the lake and the forecaster, plan them under budgets."""

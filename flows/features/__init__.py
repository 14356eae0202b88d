"""Demand features computed from the lake."""

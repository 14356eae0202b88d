"""Measurement commands behind `preheat bench ...`: each prints one JSON object."""

"""Flows that tune the platform's own parameters."""

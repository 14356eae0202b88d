"""Deploying the registered champions to serving nodes, and recording which runs where."""

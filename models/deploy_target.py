"""What a deploy is asked to do, settled before any file is touched: the node, the device, and
the version each model's alias points at now (`prepare_deployment`).

Resolved once at the start of a run and then worked by version: the alias may move during the
run, and the next run picks that up (see `models.deployment`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.node_manifest import DEFAULT_MODELS, node_dir, node_name


def resolve_device(device: str = "auto") -> str:
    """`auto`: CUDA when torch sees it, else the CPU; an explicit CUDA device must exist.

    Raises:
        ValueError: an unknown device, or CUDA asked for where torch sees none.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if re.fullmatch(r"cuda(:\d+)?", device):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: torch sees no CUDA device on this node")
        return device
    raise ValueError(f"device {device!r}: choose auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class DeployTarget:
    """Where and how to deploy, in plain values (task parameters cross processes)."""

    node: str
    data_dir: str
    tracking_uri: str
    artifacts_dir: str
    device: str  # resolved: "cpu", "cuda", "cuda:N"
    alias: str = "champion"

    @property
    def directory(self) -> Path:
        return node_dir(self.data_dir, self.node)


def resolve_versions(tracking_uri: str, names: Sequence[str], alias: str) -> dict[str, str]:
    """The version `<name>@<alias>` points at now, for every name, before anything is changed.

    Raises:
        LookupError: a model or alias that does not exist (one line: model, alias, store).
    """
    import mlflow

    from models.tracking import alias_version

    sqlite_file = tracking_uri.removeprefix("sqlite:///")
    if tracking_uri.startswith("sqlite:///") and not Path(sqlite_file).is_file():
        # Opening it would create an empty store, and leave it behind.
        raise LookupError(f"no {names[0]}@{alias} registered in {tracking_uri} (no store there)")
    client = mlflow.MlflowClient(tracking_uri)
    versions = {}
    for name in names:
        found = alias_version(client, name, alias)
        if found is None:
            raise LookupError(f"no {name}@{alias} registered in {tracking_uri}")
        versions[name] = str(found.version)
    return versions


def registered_models(tracking_uri: str, names: Sequence[str], alias: str) -> list[str]:
    """The names that have an `alias` version now (the scheduled deploy skips the others: a new
    install has no champion yet, and that is not a failure worth a red run every 15 minutes)."""
    present = []
    for name in names:
        try:
            resolve_versions(tracking_uri, [name], alias)
        except LookupError:
            continue
        present.append(name)
    return present


def prepare_deployment(
    node: str | None,
    data_dir: str | Path,
    tracking_uri: str,
    artifacts_dir: str | Path,
    models: Sequence[str] = DEFAULT_MODELS,
    alias: str = "champion",
    device: str = "auto",
) -> tuple[DeployTarget, dict[str, str]]:
    """Everything that can be wrong with the request, found before any file is touched: the
    node name, the device, and every model's version."""
    if not models:
        raise ValueError("no models to deploy")
    target = DeployTarget(
        node_name(node), str(data_dir), tracking_uri, str(artifacts_dir), resolve_device(device),
        alias,
    )  # fmt: skip
    return target, resolve_versions(tracking_uri, list(models), alias)

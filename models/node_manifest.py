"""A serving node's manifest: which version of each model it runs, and where the files are.

`<data_dir>/nodes/<node>/models.json` is the node's only truth (see `models.deployment`, which
writes it). Reading it is what every warm-up and gateway start does, so this module imports no
MLflow, Lightning or torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

# The registries' MODEL_NAMEs (models.forecast.registry, models.llm.registry), written out so
# that reading a manifest (every warm-up does) does not import MLflow and Lightning.
FORECASTER_MODEL = "preheat-forecaster"
LLM_MODEL = "preheat-llm"
DEFAULT_MODELS = (FORECASTER_MODEL, LLM_MODEL)
MANIFEST = "models.json"


def node_name(node: str | None = None) -> str:
    """`node`, or the host name, in the characters that paths, tags and limits all accept (the
    same rule as the warm-up's `warmup-<node>` limit, so the two name a node alike)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", node or socket.gethostname())
    if not name.strip("."):
        raise ValueError(f"node {node!r}: not a usable node name")
    return name


def node_dir(data_dir: str | Path, node: str | None = None) -> Path:
    return Path(data_dir) / "nodes" / node_name(node)


def deployed_tag(node: str) -> str:
    """The model-version tag that says a version runs on `node` (its value: device, time)."""
    return f"deployed.{node_name(node)}"


@dataclass(frozen=True)
class Deployed:
    """One manifest entry: the version a node runs and where its loadable files are.

    Attributes:
        path: the directory a loader takes (the LLM's `save_pretrained` directory, the
            forecaster's MLflow model directory), relative to the node directory.
    """

    name: str
    version: str
    kind: str
    path: str
    device: str
    deployed_at: str
    model_id: str | None = None  # the LLM's weight fingerprint (its KV pages' model id)
    source_run_id: str | None = None


def read_manifest(data_dir: str | Path, node: str | None = None) -> dict[str, Deployed]:
    """The node's manifest, by model name; empty when nothing was ever deployed there."""
    path = node_dir(data_dir, node) / MANIFEST
    if not path.is_file():
        return {}
    try:
        models = json.loads(path.read_text())["models"]
        return {name: Deployed(**entry) for name, entry in models.items()}
    except (ValueError, KeyError, TypeError) as error:  # written atomically: not ours
        raise ValueError(f"{path}: not a deployment manifest ({error})") from error


def deployed_model(
    data_dir: str | Path, name: str, node: str | None = None
) -> tuple[Deployed, Path] | None:
    """(entry, absolute loadable path) of the version `node` runs, or None when the node runs
    none or its files are gone (a node wiped by hand: the caller falls back to the registry)."""
    entry = read_manifest(data_dir, node).get(name)
    if entry is None:
        return None
    path = node_dir(data_dir, node) / entry.path
    return (entry, path) if path.is_dir() else None


def write_manifest(directory: Path, node: str, entries: dict[str, Deployed]) -> None:
    """Write-then-rename: a reader, or a kill, sees the old manifest or the new, never half."""
    body = {"node": node, "models": {name: asdict(e) for name, e in sorted(entries.items())}}
    partial = directory / f".{MANIFEST}.{os.getpid()}"
    with partial.open("w") as stream:
        stream.write(json.dumps(body, indent=2, sort_keys=True))
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(partial, directory / MANIFEST)


@contextmanager
def node_lock(directory: Path) -> Iterator[None]:
    """One deploy at a time per node (a schedule and a manual run may overlap): the manifest is
    read, changed and written as one step. flock dies with its process, so a kill frees it."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".deploy.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def remove_debris(node: Path, model_root: Path, keep: str | None) -> None:
    """A kill's leftovers (called under the node's lock, so no writer is active): manifest
    temp files, and everything under `models/<name>/` but the running version."""
    for stale in node.glob(f".{MANIFEST}.*"):
        stale.unlink(missing_ok=True)
    if model_root.is_dir():
        for child in model_root.iterdir():
            if child.name != keep:
                shutil.rmtree(child, ignore_errors=True)

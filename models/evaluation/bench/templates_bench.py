"""`preheat bench templates`: mine a prompt file's templates and score them.

Prints `{"n", "clusters", "coverage", "silhouette", "ari", "nmi"}` (ari/nmi only with
`--label-field`; an empty label marks a one-off; unassigned prompts and one-offs count as
singletons), plus what it cost: mining seconds and the measured `assign` cost per prompt.
Silhouette is cosine on MiniLM embeddings of a seeded sample of the assigned prompts (whole
prompts: the number says how far apart the templates' prompts are as texts).
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from models.templates.mining import Embed, MiningConfig, mine_templates
from models.templates.quality import template_quality

FORMATS = ("csv", "jsonl")
ASSIGN_SAMPLE = 2_000


class PromptFileError(ValueError):
    """The prompt file cannot be read as asked."""


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is None:
        suffix = path.suffix.lower().lstrip(".")
        fmt = {"json": "jsonl", "ndjson": "jsonl"}.get(suffix, suffix)
    if fmt not in FORMATS:
        raise PromptFileError(f"{path}: unknown --format {fmt!r}; choose csv or jsonl")
    return fmt


def _records(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "csv":
        csv.field_size_limit(sys.maxsize)  # role prompts run to 144k characters
        with open(path, newline="", encoding="utf-8") as source:
            return list(csv.DictReader(source))
    records = []
    with open(path, "rb") as source:
        for number, line in enumerate(source, 1):
            if line.strip():
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    raise PromptFileError(f"{path}:{number}: not a JSON object") from None
    return records


def read_prompts(
    path: Path, fmt: str | None, text_field: str, label_field: str | None = None
) -> tuple[list[str], list[str | None] | None]:
    """Prompts (rows with an empty text skipped) and their labels (None: a one-off)."""
    if not path.is_file():
        raise PromptFileError(f"{path}: no such file")
    try:
        records = _records(path, _format_of(path, fmt))
    except UnicodeDecodeError:
        raise PromptFileError(f"{path}: not UTF-8 text") from None
    if not records:
        raise PromptFileError(f"{path}: no rows")
    for field in (text_field, label_field):
        if field is not None and not any(isinstance(r, dict) and field in r for r in records):
            raise PromptFileError(f"{path}: no field {field!r} in any row")
    texts, labels = [], []
    for record in records:
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            continue
        texts.append(text)
        label = record.get(label_field) if label_field else None
        labels.append(None if label in (None, "", -1, "-1") else str(label))
    if not texts:
        raise PromptFileError(f"{path}: no row has a non-empty {text_field!r}")
    return texts, (labels if label_field else None)


def _assign_cost_us(assign: Callable[[str], str | None], prompts: list[str]) -> float:
    sample = prompts[:ASSIGN_SAMPLE]
    start = time.perf_counter()
    for prompt in sample:
        assign(prompt)
    return (time.perf_counter() - start) / len(sample) * 1e6


def bench_templates(
    path: Path,
    fmt: str | None,
    text_field: str,
    label_field: str | None = None,
    config: MiningConfig | None = None,
    embed: Embed | None = None,
    silhouette_sample: int = 2_000,
    seed: int = 0,
) -> dict[str, Any]:
    """The JSON object of `preheat bench templates` (fields named in issue 6)."""
    prompts, labels = read_prompts(path, fmt, text_field, label_field)
    if embed is None:
        from models.templates.embeddings import shared_embedder

        embed = shared_embedder().embed
    start = time.perf_counter()
    mined = mine_templates(prompts, embed, config)
    seconds = time.perf_counter() - start
    assigned = [i for i, label in enumerate(mined.labels) if label is not None]
    rng = np.random.default_rng(seed)
    if len(assigned) > silhouette_sample:
        assigned = sorted(rng.choice(assigned, size=silhouette_sample, replace=False).tolist())
    out = template_quality(labels, mined.labels, None)
    out["coverage"] = round(out["coverage"], 4)
    if assigned:  # else undefined: None, as with a single template
        vectors = np.asarray(embed([prompts[i] for i in assigned]), dtype=np.float32)
        kept = [mined.labels[i] for i in assigned]
        out["silhouette"] = template_quality(None, kept, vectors, seed)["silhouette"]
    for name in ("silhouette", "ari", "nmi"):
        if out.get(name) is not None:
            out[name] = round(out[name], 4)
    out["mining_s"] = round(seconds, 2)
    out["assign_us_per_prompt"] = round(_assign_cost_us(mined.assign, prompts), 1)
    return out

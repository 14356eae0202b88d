"""Mining every tenant's templates from request logs: what the `mine-templates` flow runs.

Templates never cross tenants (a bank's system prompt is not another tenant's), so each tenant
is mined on its own, keeping the ids of its previous templates. Quality per tenant: coverage and
silhouette always (silhouette on a sample of assigned prompts, embedded here: the mining itself
embeds only candidate constants), ARI/NMI against the log's own `template_id` where the source
had one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from data_contracts.templates import empty_templates
from models.templates.mining import Embed, MiningConfig, mine_templates
from models.templates.quality import template_quality


@dataclass
class TenantsMining:
    """The new templates table (all tenants) and what the run measured."""

    table: pd.DataFrame
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # tenant -> quality
    top: pd.DataFrame = field(default_factory=empty_templates)


def _previous_of(previous: pd.DataFrame, tenant: str) -> dict[str, str]:
    rows = previous[previous["tenant"] == tenant]
    return dict(zip(rows["template_id"], rows["constant_text"], strict=True))


def _silhouette_sample(
    labels: list[str | None], prompts: list[str], size: int, seed: int
) -> tuple[list[str], list[str]]:
    assigned = [i for i, label in enumerate(labels) if label is not None]
    rng = np.random.default_rng(seed)
    if len(assigned) > size:
        assigned = sorted(rng.choice(assigned, size=size, replace=False).tolist())
    return [prompts[i] for i in assigned], [labels[i] for i in assigned]  # type: ignore[misc]


def _quality(
    rows: pd.DataFrame, labels: list[str | None], embed: Embed | None, sample: int, seed: int
) -> dict[str, Any]:
    out = template_quality(None, labels, None)
    truth = rows["template_id"]
    known = truth.notna().to_numpy()
    if known.any():
        scored = template_quality(
            truth[known].tolist(), [x for x, k in zip(labels, known, strict=True) if k], None
        )
        out.update(ari=scored["ari"], nmi=scored["nmi"], labelled=int(known.sum()))
    if embed is not None and sample > 0:
        texts, kept = _silhouette_sample(labels, rows["prompt"].tolist(), sample, seed)
        if texts:
            vectors = np.asarray(embed(texts), dtype=np.float32)
            out["silhouette"] = template_quality(None, kept, vectors, seed)["silhouette"]
    return out


def mine_tenants(
    requests: pd.DataFrame,
    previous: pd.DataFrame,
    mined_at: pd.Timestamp,
    config: MiningConfig | None = None,
    embed: Embed | None = None,
    top_k: int = 20,
    max_prompts: int = 50_000,
    silhouette_sample: int = 1_000,
    seed: int = 0,
) -> TenantsMining:
    """Mine each tenant's most recent prompts (at most `max_prompts`).

    Args:
        requests: rows with `timestamp`, `tenant`, `prompt`, `template_id` (null prompts skipped).
        previous: the stored `TemplateTable` (ids are kept where a template barely changed).
        mined_at: stamped on every row.
        config: mining knobs; embed: texts -> embeddings (default: the shared MiniLM).
        top_k: templates per tenant in `top`; silhouette_sample: prompts embedded for it (0: skip).
    """
    config = config or MiningConfig()
    if embed is None and config.method != "structure":
        from models.templates.embeddings import shared_embedder

        embed = shared_embedder().embed
    with_prompt = requests[requests["prompt"].notna()].sort_values("timestamp", kind="stable")
    frames, tops, metrics = [], [], {}
    for tenant, rows in with_prompt.groupby("tenant", sort=True):
        rows = rows.tail(max_prompts)
        if len(rows) < config.min_support:
            continue
        prompts = rows["prompt"].astype(str).tolist()
        mined = mine_templates(prompts, embed, config, _previous_of(previous, str(tenant)))
        frame = mined.to_frame(str(tenant), mined_at)
        frames.append(frame)
        tops.append(frame.head(top_k))
        metrics[str(tenant)] = {
            "prompts": len(prompts),
            "templates": len(mined.templates),
            **_quality(rows, mined.labels, embed, silhouette_sample, seed),
        }
    # A tenant with too few prompts this time keeps its templates: no traffic is not a re-mining.
    kept = previous[~previous["tenant"].isin(list(metrics))]
    frames += [kept] if len(kept) else []
    table = pd.concat(frames, ignore_index=True) if frames else empty_templates()
    top = pd.concat(tops, ignore_index=True) if tops else empty_templates()
    return TenantsMining(table, metrics, top)

"""A realistic, seeded multi-tenant request log that the demo and the tests generate themselves.

What makes it realistic (each a property the forecasting and warm-up work depends on):
- template popularity per tenant is Zipf-distributed (a few templates take most traffic);
- arrivals follow a daily cycle (quiet nights, busy afternoons) as a non-homogeneous Poisson
  process, plus short bursts where one template's rate jumps (a news event, a batch job);
- requests of one session share a tenant and arrive minutes apart;
- prompts of a template share its system prompt and instruction, so their prefix-block hashes
  share a leading run, and each request adds slot blocks of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from cache_runtime.prefix_hash import PAGE_TOKENS, chain_block_hashes

INSTRUCTIONS = (
    "Summarise this filing for a credit analyst:",
    "Explain this code and list its risks:",
    "Classify this card transaction as fraud or not:",
    "Draft a reply to this customer complaint:",
    "Extract the counterparties and amounts from this contract:",
    "Translate this term sheet into plain English:",
    "List the covenants in this loan agreement:",
    "Answer the client's question about this fund:",
)
SLOT_WORDS = ("revenue", "EBITDA", "coupon", "maturity", "ISIN", "swap", "hedge", "margin",
              "liquidity", "tranche", "spread", "dividend", "collateral", "invoice")  # fmt: skip


DEFAULT_START = pd.Timestamp("2024-03-04T00:00:00Z")  # a Monday


@dataclass(frozen=True)
class SyntheticLogSpec:
    """Knobs of the generated log; the defaults make ~30k requests over two days."""

    days: float = 2.0
    requests_per_day: int = 15_000
    tenants: tuple[str, ...] = ("acme-bank", "globex-fin", "initech")
    tenant_weights: tuple[float, ...] = (0.5, 0.3, 0.2)
    templates_per_tenant: int = 40
    zipf_s: float = 1.1
    bursts: int = 6
    burst_minutes: float = 10.0
    burst_factor: float = 12.0
    start: pd.Timestamp = DEFAULT_START
    seed: int = 7


def _daily_rate(hours: np.ndarray) -> np.ndarray:
    """Relative arrival rate by hour of day: trough ~4am, peak ~3pm, ratio ~8x."""
    return 1.0 + 0.78 * np.sin(2 * np.pi * (hours - 9.0) / 24.0)


def _arrival_seconds(spec: SyntheticLogSpec, rng: np.random.Generator) -> np.ndarray:
    """Non-homogeneous Poisson arrivals by thinning a homogeneous process at the peak rate."""
    horizon = spec.days * 86_400
    mean_rate = spec.requests_per_day / 86_400
    peak = mean_rate * 1.78
    candidates = np.sort(rng.uniform(0, horizon, rng.poisson(peak * horizon)))
    keep = rng.uniform(0, 1.78, len(candidates)) < _daily_rate(candidates / 3600 % 24)
    return candidates[keep]


def _template_choice(spec: SyntheticLogSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    ranks = np.arange(1, spec.templates_per_tenant + 1)
    weights = ranks**-spec.zipf_s
    return rng.choice(spec.templates_per_tenant, size=n, p=weights / weights.sum())


def _bursts(spec: SyntheticLogSpec, rng: np.random.Generator) -> pd.DataFrame:
    """Extra arrivals: for each burst, one (tenant, template) at `burst_factor` x its usual rate."""
    horizon = spec.days * 86_400
    rows = []
    for _ in range(spec.bursts):
        start = rng.uniform(0, horizon - spec.burst_minutes * 60)
        tenant = int(rng.choice(len(spec.tenants), p=np.array(spec.tenant_weights)))
        template = int(rng.integers(0, spec.templates_per_tenant))
        usual = (
            spec.requests_per_day / 86_400 * spec.tenant_weights[tenant] / spec.templates_per_tenant
        )
        count = rng.poisson(usual * spec.burst_factor * 20 * spec.burst_minutes * 60)
        for second in np.sort(rng.uniform(start, start + spec.burst_minutes * 60, count)):
            rows.append((second, tenant, template))
    return pd.DataFrame(rows, columns=["second", "tenant", "template"])


def generate_requests(spec: SyntheticLogSpec = SyntheticLogSpec()) -> list[dict]:
    """The log as generic-format records (dicts), in time order."""
    rng = np.random.default_rng(spec.seed)
    seconds = _arrival_seconds(spec, rng)
    weights = np.array(spec.tenant_weights) / sum(spec.tenant_weights)
    base = pd.DataFrame(
        {
            "second": seconds,
            "tenant": rng.choice(len(spec.tenants), size=len(seconds), p=weights),
            "template": _template_choice(spec, rng, len(seconds)),
        }
    )
    bursts = _bursts(spec, rng)
    arrivals = pd.concat([base, bursts]) if len(bursts) else base
    arrivals = arrivals.sort_values("second", ignore_index=True)
    system_blocks = {
        t: rng.integers(0, 30_000, size=(3, PAGE_TOKENS)) for t in range(len(spec.tenants))
    }
    records = []
    session_of: dict[int, tuple[str, float]] = {}
    template_hashes: dict[int, list[int]] = {}  # system prompt + instruction, shared by a template
    for i, (second, tenant, template) in enumerate(arrivals.itertuples(index=False)):
        tenant, template = int(tenant), int(template)
        name = spec.tenants[tenant]
        session, last = session_of.get(tenant * 1000 + template, ("", -1e9))
        if second - last > 600 or rng.uniform() < 0.3:  # a new session after 10 min or by chance
            session = f"{name}-s{i}"
        session_of[tenant * 1000 + template] = (session, second)
        key = tenant * 1000 + template
        if key not in template_hashes:
            instruction = np.random.default_rng(key).integers(0, 30_000, size=(2, PAGE_TOKENS))
            template_hashes[key] = chain_block_hashes([*system_blocks[tenant], *instruction])
        shared = template_hashes[key]
        slot_blocks = rng.integers(0, 30_000, size=(int(rng.integers(1, 6)), PAGE_TOKENS))
        hashes = shared + chain_block_hashes(slot_blocks, parent=shared[-1])
        words = " ".join(rng.choice(SLOT_WORDS, size=int(rng.integers(3, 12))))
        prompt_tokens = len(hashes) * PAGE_TOKENS + int(rng.integers(0, PAGE_TOKENS))
        records.append(
            {
                "timestamp": (spec.start + pd.Timedelta(seconds=float(second))).isoformat(),
                "tenant": name,
                "request_id": f"{name}-{i:07d}",
                "session_id": session,
                "prompt": f"{INSTRUCTIONS[template % len(INSTRUCTIONS)]} [{template}] {words}",
                "prompt_tokens": prompt_tokens,
                "output_tokens": int(rng.integers(8, 400)),
                "prefix_hashes": hashes,
                "template_id": f"t{template:03d}",
                "route": "/v1/chat/completions",
                "latency_ms": round(40 + 0.35 * prompt_tokens + float(rng.gamma(2.0, 30.0)), 2),
                "priority": 1 + (template * 7) % 10,
            }
        )
    return records


def write_synthetic_log(path: Path, spec: SyntheticLogSpec = SyntheticLogSpec()) -> int:
    """Write the generated log as JSONL; returns the number of requests."""
    records = generate_requests(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as sink:
        for record in records:
            sink.write(orjson.dumps(record) + b"\n")
    return len(records)

"""Model-free behavioural tests of the generated log and of chained prefix hashes."""

from __future__ import annotations

import pandas as pd

from cache_runtime.prefix_hash import chain_block_hashes, token_blocks
from models.ingest.synthetic import SyntheticLogSpec, generate_requests

SPEC = SyntheticLogSpec(days=1.0, requests_per_day=6000, bursts=2, seed=11)


def test_generation_is_seeded() -> None:
    assert generate_requests(SPEC)[:50] == generate_requests(SPEC)[:50]
    assert generate_requests(SPEC)[:5] != generate_requests(SyntheticLogSpec(seed=12, days=0.1))[:5]


def test_log_has_zipf_templates_daily_cycle_and_tenants() -> None:
    log = pd.DataFrame(generate_requests(SPEC))
    log["timestamp"] = pd.to_datetime(log["timestamp"], format="ISO8601")
    shares = (
        log.groupby(["tenant", "template_id"])
        .size()
        .groupby("tenant")
        .apply(lambda s: s.max() / s.sum())
    )
    assert (shares > 0.12).all()  # the top template of every tenant takes far more than 1/40
    hourly = log.set_index("timestamp").resample("1h").size()
    assert hourly.max() / max(hourly.min(), 1) > 3  # quiet nights, busy afternoons
    assert set(log["tenant"]) == set(SPEC.tenants)
    assert log["timestamp"].is_monotonic_increasing and log["request_id"].is_unique


def test_prompts_of_a_template_share_their_leading_prefix_blocks() -> None:
    log = pd.DataFrame(generate_requests(SPEC))
    same = log[(log["tenant"] == "acme-bank") & (log["template_id"] == "t000")]["prefix_hashes"]
    first, second = same.iloc[0], same.iloc[1]
    assert first[:5] == second[:5] and first[5] != second[5]
    other = log[(log["tenant"] == "acme-bank") & (log["template_id"] == "t001")]["prefix_hashes"]
    assert other.iloc[0][:3] == first[:3] and other.iloc[0][3] != first[3]  # shared system prompt


def test_chained_hashes_share_exactly_the_common_prefix() -> None:
    a = chain_block_hashes([[1, 2], [3, 4], [5, 6]])
    b = chain_block_hashes([[1, 2], [3, 4], [7, 8]])
    c = chain_block_hashes([[9, 9], [3, 4], [5, 6]])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert all(x != y for x, y in zip(a, c, strict=True))  # same block later, different prefix
    assert all(-(2**63) <= h < 2**63 for h in a)
    assert chain_block_hashes([[3, 4]], parent=a[0]) == a[1:2]


def test_token_blocks_drop_the_partial_tail() -> None:
    assert token_blocks(list(range(35)), 16) == [list(range(16)), list(range(16, 32))]
    assert token_blocks([1, 2], 16) == []

"""The warm-up planner: tiers, order, budgets, deadline, closure, reasons; contracts; candidates."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pandera.errors
import pytest

from data_contracts import RequestLog, WarmupCandidate, WarmupPlan
from data_contracts.dtypes import STRING
from data_contracts.warmup import TIERS
from models.features.demand import demand_series
from models.warmup.candidates import CandidateOptions, tiny_gpt2_kv_bytes_per_token
from models.warmup.plan import Budgets, CostModel, build_candidates, plan_warmup

AMPLE = Budgets(memory_bytes=10**9, ssd_bytes=0, redis_bytes=0, compute_s=1e6, deadline_s=1e6)


def candidate(item: str, **fields: Any) -> dict[str, Any]:
    row = {
        "tenant": "t", "key": f"key:{item}", "item": item, "kind": "kv_prefix", "parent": None,
        "predicted_hits": 10.0, "latency_saved_s": 0.1, "bytes": 100, "compute_s": 0.1,
        "fanout": 1, "needed_in_s": 60.0, "source": "forecast",
    }  # fmt: skip
    row.update(fields)
    return row


def frame(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def ranked(*hits: float, **fields: Any) -> pd.DataFrame:
    """Candidates a, b, c, ... with these predicted hits and otherwise the same fields."""
    names = "abcdefgh"
    return frame(*(candidate(names[i], predicted_hits=h, **fields) for i, h in enumerate(hits)))


def tiers_of(result: Any) -> dict[str, str]:
    return dict(zip(result.plan["item"].tolist(), result.plan["tier"].tolist(), strict=True))


def reason_of(result: Any, item: str) -> str:
    excluded = result.excluded.set_index(result.excluded["item"].astype(object))
    return str(excluded.loc[item, "reason"])


# -- tiers -----------------------------------------------------------------------------------


def test_densest_items_fill_memory_then_ssd_then_redis() -> None:
    budgets = Budgets(200, 100, 100, compute_s=10, deadline_s=10)
    result = plan_warmup(ranked(50, 40, 30, 20, 10), budgets)
    assert tiers_of(result) == {"a": "memory", "b": "memory", "c": "ssd", "d": "redis"}
    assert (
        reason_of(result, "e") == "next best: score 1.00; out because memory/ssd/redis budget full"
    )
    assert result.summary["tiers"]["memory"] == {"items": 2, "bytes": 200, "budget_bytes": 200}


def test_density_not_score_decides_the_tier() -> None:
    # "big" saves the most seconds but per byte the least: the small items take memory.
    rows = [
        candidate("big", predicted_hits=100, bytes=1000),
        candidate("small1", predicted_hits=20, bytes=100),
        candidate("small2", predicted_hits=15, bytes=100),
    ]
    result = plan_warmup(frame(*rows), Budgets(200, 1000, 0, compute_s=10, deadline_s=10))
    assert tiers_of(result) == {"small1": "memory", "small2": "memory", "big": "ssd"}


def test_prefix_fill_moves_on_and_backfill_uses_what_is_left() -> None:
    rows = [
        candidate("a", predicted_hits=100, bytes=100),  # density 0.1
        candidate("b", predicted_hits=100, bytes=200),  # 0.05: does not fit memory's 150 left
        candidate("c", predicted_hits=20, bytes=50),  # 0.04
    ]
    spill = plan_warmup(frame(*rows), Budgets(250, 1000, 0, compute_s=10, deadline_s=10))
    assert tiers_of(spill) == {"a": "memory", "b": "ssd", "c": "ssd"}  # SSD continues the fill
    backfill = plan_warmup(frame(*rows), Budgets(250, 200, 0, compute_s=10, deadline_s=10))
    assert tiers_of(backfill) == {"a": "memory", "b": "ssd", "c": "memory"}  # 150 left in memory


def test_a_child_is_never_in_a_faster_tier_than_its_parent() -> None:
    rows = [
        candidate("p", predicted_hits=10, bytes=300),
        candidate("c", parent="p", predicted_hits=100, bytes=50),
    ]
    result = plan_warmup(frame(*rows), Budgets(100, 1000, 0, compute_s=10, deadline_s=10))
    assert tiers_of(result) == {"p": "ssd", "c": "ssd"}  # memory had room for c, not for p


# -- order -----------------------------------------------------------------------------------


def test_order_is_dependency_then_countdown_fanout_score() -> None:
    rows = [
        candidate("x", needed_in_s=50, fanout=1, predicted_hits=30),
        candidate("y", needed_in_s=50, fanout=3, predicted_hits=10),
        candidate("z", needed_in_s=50, fanout=3, predicted_hits=20),
        candidate("p", needed_in_s=100, fanout=2),
        candidate("c", parent="p", needed_in_s=10),
        candidate("late", needed_in_s=500),
    ]
    result = plan_warmup(frame(*rows), AMPLE)
    # p runs at its child's urgency (10 s), just before it; then 50 s by fanout, then by score.
    assert result.plan["item"].tolist() == ["p", "c", "z", "y", "x", "late"]
    assert result.plan["order"].tolist() == list(range(6))
    assert result.plan["start_s"].tolist() == pytest.approx([0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert result.plan["finish_s"].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


# -- compute, deadline, closure --------------------------------------------------------------


def test_deadline_binds_and_is_named() -> None:
    rows = ranked(30, 20, 10, compute_s=0.4)
    result = plan_warmup(rows, Budgets(10**6, 0, 0, compute_s=100, deadline_s=1.0))
    assert result.plan["item"].tolist() == ["a", "b"]
    assert result.plan["finish_s"].max() <= 1.0
    assert reason_of(result, "c").endswith("out because would finish after the deadline")


def test_compute_budget_binds_and_is_named() -> None:
    rows = ranked(30, 20, 10, compute_s=0.4)
    result = plan_warmup(rows, Budgets(10**6, 0, 0, compute_s=0.5, deadline_s=100))
    assert result.plan["item"].tolist() == ["a"]
    assert reason_of(result, "b") == "next best: score 2.00; out because compute budget"
    assert result.summary["excluded_by_reason"] == {"compute budget": 2}


def test_cheap_items_after_the_binding_one_still_get_in() -> None:
    rows = [
        candidate("a", predicted_hits=30, compute_s=0.6),
        candidate("b", predicted_hits=20, compute_s=0.6),  # does not fit the 0.4 s left
        candidate("c", predicted_hits=1, compute_s=0.3),  # does
    ]
    result = plan_warmup(frame(*rows), Budgets(10**6, 0, 0, compute_s=1.0, deadline_s=100))
    assert sorted(result.plan["item"]) == ["a", "c"]
    assert result.summary["compute_s"] == pytest.approx(0.9)


def test_an_excluded_parent_takes_its_descendants_out() -> None:
    rows = [
        candidate("p", bytes=5000),
        candidate("c", parent="p", predicted_hits=99),
        candidate("g", parent="c", predicted_hits=99),
        candidate("other"),
    ]
    result = plan_warmup(frame(*rows), Budgets(1000, 0, 0, compute_s=10, deadline_s=10))
    assert result.plan["item"].tolist() == ["other"]
    assert reason_of(result, "p").endswith("out because memory budget full")
    assert reason_of(result, "c").endswith("out because parent not planned (p)")
    assert reason_of(result, "g").endswith("out because parent not planned (c)")


def test_no_predicted_hits_means_not_warmed() -> None:
    result = plan_warmup(frame(candidate("a", predicted_hits=0), candidate("b")), AMPLE)
    assert result.plan["item"].tolist() == ["b"]
    assert reason_of(result, "a").endswith("out because no predicted hits")


def test_nothing_to_plan_is_an_empty_valid_plan() -> None:
    nothing = build_candidates(request_log().iloc[:0])
    result = plan_warmup(nothing, AMPLE)
    assert result.plan.empty and result.excluded.empty
    assert result.to_json()["summary"]["planned"] == 0


def test_reasons_say_value_tier_and_timing() -> None:
    rows = [
        candidate("shared", predicted_hits=41, latency_saved_s=0.3, needed_in_s=120, fanout=4),
        candidate("slow", predicted_hits=5, compute_s=2.0, needed_in_s=1.0),
    ]
    result = plan_warmup(frame(*rows), AMPLE)
    reasons = dict(zip(result.plan["item"], result.plan["reason"], strict=True))
    assert reasons["slow"] == (
        "score 0.50 s saved = 5.0 hits x 0.100 s; fits memory; "
        "ready 1.0 s after its first predicted request"
    )
    assert reasons["shared"] == (
        "score 12.30 s saved = 41.0 hits x 0.300 s; fits memory; needed in 120 s, ready at "
        "2.1 s; shared by 4 keys"
    )
    assert result.summary["late_items"] == 1


def test_random_plans_respect_every_budget_and_the_contract() -> None:
    candidates = synthetic(3000, seed=1)
    rng = np.random.default_rng(2)
    for _ in range(5):
        memory, ssd, redis = (int(b) for b in rng.integers(0, 2 * 10**7, 3))
        compute_s, deadline_s = (float(s) for s in rng.uniform(0, 400, 2))
        budgets = Budgets(memory, ssd, redis, compute_s, deadline_s)
        plan = plan_warmup(candidates, budgets).plan
        used = plan.groupby(plan["tier"].astype(object))["bytes"].sum()
        for tier, budget in zip(TIERS, budgets.tier_bytes, strict=True):
            assert used.get(tier, 0) <= budget
        assert plan["compute_s"].sum() <= budgets.compute_s
        assert (plan["finish_s"] <= budgets.deadline_s).all()
        planned = set(zip(plan["tenant"], plan["item"], strict=True))
        parents = plan.dropna(subset=["parent"])
        pairs = zip(parents["tenant"], parents["parent"], strict=True)
        assert all(pair in planned for pair in pairs)


def test_100k_candidates_are_planned() -> None:
    candidates = synthetic(100_000, seed=0)
    budgets = Budgets(10**8, 10**9, 10**8, compute_s=2000.0, deadline_s=3000.0)
    result = plan_warmup(candidates, budgets)
    assert 0 < result.summary["planned"] < 100_000
    assert result.plan["finish_s"].max() <= 2000.0
    assert len(result.excluded) == 20


# -- contracts and the plan's JSON -----------------------------------------------------------


def test_budgets_refuse_negative_or_infinite_values() -> None:
    with pytest.raises(ValueError, match="memory_bytes must be finite and >= 0, got -1"):
        Budgets(-1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="deadline_s must be finite"):
        Budgets(0, 0, 0, 0, float("inf"))


def test_candidate_contract_rejects_bad_rows() -> None:
    rows = frame(candidate("a", bytes=-5), candidate("b", parent="nowhere"))
    with pytest.raises(pandera.errors.SchemaErrors) as caught:
        WarmupCandidate.validate(rows, lazy=True)
    cases = caught.value.failure_cases
    assert set(cases["check"]) == {"greater_than(0)", "parent_is_a_candidate_of_the_same_tenant"}
    assert cases.loc[cases["check"] == "greater_than(0)", "column"].tolist() == ["bytes"]


def test_parent_cycle_is_refused() -> None:
    rows = frame(candidate("a", parent="b"), candidate("b", parent="a"))
    with pytest.raises(ValueError, match="cycle"):
        plan_warmup(rows, AMPLE)


def test_plan_contract_rejects_a_child_planned_before_its_parent() -> None:
    plan = plan_warmup(frame(candidate("p"), candidate("c", parent="p")), AMPLE).plan
    swapped = plan.assign(order=[1, 0])
    with pytest.raises(pandera.errors.SchemaErrors) as caught:
        WarmupPlan.validate(swapped, lazy=True)
    cases = caught.value.failure_cases
    assert set(cases["check"]) == {"planned_parent_comes_earlier_in_a_tier_no_slower"}
    assert set(cases["index"]) == {1}  # the child
    faster_child = plan.assign(tier=["ssd", "memory"])
    with pytest.raises(pandera.errors.SchemaErrors, match="no_slower"):
        WarmupPlan.validate(faster_child, lazy=True)


def test_plan_json_is_strict_json() -> None:
    rows = [candidate("p"), candidate("c", parent="p"), candidate("x", bytes=10**12)]
    document = plan_warmup(frame(*rows), AMPLE).to_json()
    text = json.dumps(document, allow_nan=False)
    assert json.loads(text)["items"][1]["parent"] == "p"
    assert document["items"][0]["parent"] is None
    assert document["excluded"][0]["item"] == "x"
    assert set(document["summary"]) >= {"tiers", "compute_s", "total_score_s", "fallback"}


# -- candidates --------------------------------------------------------------------------------


def test_candidates_share_the_system_prompt_and_fall_back_without_a_forecast() -> None:
    requests = request_log()
    candidates = build_candidates(requests)
    assert set(candidates["source"]) == {"recency_frequency"}
    kv = candidates[candidates["kind"] == "kv_prefix"].set_index("item")
    shared = kv.loc["kv:prefix:13"]
    assert (shared["key"], shared["fanout"]) == ("prefix:11", 2)
    assert pd.isna(shared["parent"])
    assert shared["bytes"] == 3 * 16 * tiny_gpt2_kv_bytes_per_token() == 3 * 16 * 1024
    assert kv.loc["kv:template:a", "parent"] == "kv:prefix:13"
    assert kv.loc["kv:template:a", "bytes"] == 2 * 16 * 1024  # its own blocks after the shared
    assert kv.loc["kv:template:b", "bytes"] == 1 * 16 * 1024
    prompts = candidates[candidates["kind"] != "kv_prefix"]
    assert sorted(prompts["kind"]) == ["embedding", "response"]  # "same question" repeats
    result = plan_warmup(candidates, AMPLE)
    assert "not the forecaster" in result.summary["fallback"]


def test_candidates_use_the_forecast_and_heat_for_keys_it_does_not_name() -> None:
    requests = request_log()
    demand = demand_series(requests, ["3min"])["3min"]
    now = pd.Timestamp("2024-03-04T00:12:00Z")
    forecast = pd.DataFrame(
        {
            "tenant": "acme", "key": "template:a", "granularity": "3min", "step": [1, 2],
            "bucket_start": [now, now + pd.Timedelta(minutes=3)], "predicted": [0.5, 3.0],
        }
    )  # fmt: skip
    candidates = build_candidates(requests, forecast, demand, CostModel(), now=now)
    sources = dict(zip(candidates["item"], candidates["source"], strict=True))
    assert sources["kv:template:a"] == "forecast"
    assert sources["kv:template:b"] == "heat"
    assert sources["kv:prefix:13"] == "heat"  # a parent is as weak as its weakest key
    own = candidates.set_index("item").loc["kv:template:a"]
    assert own["predicted_hits"] == pytest.approx(3.5)  # every request of `a` has its run
    # The expected count reaches 1 a sixth into bucket 2: 0.5 of its 3.0 are needed.
    assert own["needed_in_s"] == pytest.approx(180.0 + 180.0 / 6)


def test_old_requests_outside_the_window_are_ignored() -> None:
    options = CandidateOptions(window_s=60.0)
    candidates = build_candidates(request_log(), options=options)
    assert set(candidates["key"]) <= {"template:b", "prefix:11"}


# -- fixtures as functions ---------------------------------------------------------------------


def request_log() -> pd.DataFrame:
    """Two templates on one system prompt (blocks 11, 12, 13): `a` adds 21, 22; `b` adds 31;
    each request adds one block of its own. `a`'s first prompt repeats."""
    rows = []
    start = pd.Timestamp("2024-03-04T00:00:00Z")
    for i in range(12):
        template = "a" if i < 8 else "b"
        own = [21, 22] if template == "a" else [31]
        rows.append(
            {
                "timestamp": start + pd.Timedelta(seconds=60 * i), "tenant": "acme",
                "request_id": f"r{i}", "session_id": f"s{i}",
                "prompt": "same question" if i in (0, 3, 5) else f"question {i}",
                "prompt_tokens": 16 * (4 + len(own)), "output_tokens": 50,
                "prefix_hashes": [11, 12, 13, *own, 1000 + i], "template_id": template,
                "route": "/v1/chat", "latency_ms": 100.0, "priority": 5,
            }
        )  # fmt: skip
    return RequestLog.validate(pd.DataFrame(rows))


def synthetic(n: int, seed: int) -> pd.DataFrame:
    """`n` candidates, a tenth of them parents of the rest, for property and scale tests."""
    rng = np.random.default_rng(seed)
    parents = n // 10
    parent = np.where(np.arange(n) < parents, -1, rng.integers(0, parents, n))
    owner = np.where(parent >= 0, parent, np.arange(n))  # a child lives in its parent's tenant
    items = np.char.add("i", np.arange(n).astype(str))
    parent_items = np.where(parent >= 0, np.char.add("i", parent.astype(str)), None)
    return pd.DataFrame(
        {
            "tenant": pd.Series(np.char.add("t", (owner % 3).astype(str)), dtype=STRING),
            "key": pd.Series(items, dtype=STRING),
            "item": pd.Series(items, dtype=STRING),
            "kind": "kv_prefix",
            "parent": pd.Series(parent_items, dtype=STRING),
            "predicted_hits": rng.zipf(1.5, n).clip(max=1000).astype(float),
            "latency_saved_s": rng.uniform(0.001, 0.1, n),
            "bytes": rng.integers(1_000, 100_000, n),
            "compute_s": rng.uniform(0.001, 0.2, n),
            "fanout": 1,
            "needed_in_s": rng.uniform(0, 600, n),
            "source": "forecast",
        }
    )

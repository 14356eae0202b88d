"""The gateway's twelve metrics from known inputs, without a server: windows, ROI, saved
latency, forecast error, attribution from real warm-up ledgers, canary and cost shares, SLA,
cold start, and the exposition naming every one of them."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cache_runtime.keys import EmbeddingKey, ExactKey
from cache_runtime.kv_pages import PAGE_TOKENS
from cache_runtime.node_cache import EMBEDDING_MODEL_ID
from cache_runtime.serving.metrics import DERIVED, HELP, GatewayMetrics, tenant_label
from cache_runtime.serving.system import accelerator_memory
from cache_runtime.serving.warmed import WarmupLedgers
from cache_runtime.serving.windows import DecayedSum, SlidingCounts, quantile
from models.features.demand import demand_keys
from models.llm.backends import WarmResult
from models.serving.chain import Served
from models.serving.forecast_error import ForecastError, demand_key, first_block_hash
from models.serving.runners import prefix_hashes
from models.serving.savings import ModelCost, Roi, Savings
from models.serving.signals import Signals, SignalSettings
from models.warmup.execute import WarmItem, WarmLedger

MODEL = "tiny-model"


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tokens(text: str) -> list[int]:
    """A stand-in tokenizer: one token per character."""
    return [ord(c) for c in text]


def served(outcome: str, key: str | None = None, **fields: object) -> Served:
    values: dict[str, object] = {
        "text": "answer", "finish_reason": "stop", "prompt_tokens": 40, "completion_tokens": 8,
        "cached_tokens": 0, "outcome": outcome, "key": key, "template": None,
        "prompt_ids": None, "model_s": 0.0,
    }  # fmt: skip
    values.update(fields)
    return Served(**values)  # type: ignore[arg-type]


def sample(signals: Signals, name: str, *labels: str) -> float:
    for label_values, value in signals.samples()[name]:
        if label_values == labels:
            return value
    raise KeyError((name, labels))


# -- windows --------------------------------------------------------------------------------------


def test_sliding_counts_forget_what_left_the_window() -> None:
    clock = Clock(0.0)
    window = SlidingCounts(60.0, clock, slots=6)
    window.add("a", 2)
    clock.now = 30.0
    window.add("a")
    window.add("b", 5)
    assert window.totals() == {"a": 3, "b": 5}
    clock.now = 65.0  # the first add (t=0, slot 0..10) is out, the second is in
    assert window.totals() == {"a": 1, "b": 5}
    clock.now = 100.0
    assert window.totals() == {}


def test_decayed_sum_halves_every_half_life_and_accepts_late_amounts() -> None:
    clock = Clock(0.0)
    decayed = DecayedSum(10.0, clock)
    decayed.add(8.0)
    clock.now = 10.0
    assert decayed.value() == pytest.approx(4.0)
    decayed.add(4.0, at=0.0)  # dated in the past: decayed as if added then
    assert decayed.value() == pytest.approx(6.0)
    clock.now = 30.0
    assert decayed.value() == pytest.approx(6.0 / 4)


def test_quantile_is_nearest_rank() -> None:
    assert quantile([0.3, 0.1, 0.2, 0.4], 0.95) == 0.4
    assert quantile([1.0] * 19 + [9.0], 0.95) == 1.0
    assert math.isnan(quantile([], 0.5))


# -- ROI and saved latency ------------------------------------------------------------------------


def test_roi_is_value_minus_cost_over_cost_and_decays_each_contribution() -> None:
    clock = Clock(0.0)
    roi = Roi(value_per_saved_s=2.0, cost_per_compute_s=0.5, half_life_s=100.0, clock=clock)
    assert math.isnan(roi.roi())  # no cost yet: undefined, not infinite
    roi.compute_s.add(20.0)  # cost 10
    roi.saved_s.add(15.0)  # value 30
    assert roi.roi() == pytest.approx((30 - 10) / 10)
    clock.now = 100.0  # both halve: the ratio stays
    assert (roi.value(), roi.cost()) == pytest.approx((15.0, 5.0))
    assert roi.roi() == pytest.approx(2.0)
    roi.saved_s.add(5.0)  # value now 15 + 10 = 25 against cost 5
    assert roi.roi() == pytest.approx((25 - 5) / 5)


def test_model_cost_recovers_prefill_and_decode_seconds_per_token() -> None:
    cost = ModelCost()
    assert cost.coefficients() is None
    cost.observe(100, 10, 100 * 0.001 + 10 * 0.02)
    assert cost.coefficients() == pytest.approx((0.3 / 110, 0.3 / 110))  # one call: a ratio
    for prompt, completion in ((50, 20), (200, 5), (10, 16)):
        cost.observe(prompt, completion, prompt * 0.001 + completion * 0.02)
    assert cost.coefficients() == pytest.approx((0.001, 0.02))
    assert cost.seconds(300, 4) == pytest.approx(0.38)


def test_warmed_hits_are_priced_by_the_timed_model_calls_even_when_seen_first() -> None:
    clock = Clock(0.0)
    roi = Roi(value_per_saved_s=1.0, clock=clock)
    savings = Savings(roi, clock)
    assert savings.warmed_hit("exact", 100, 10) is None  # nothing timed yet: waits
    for prompt, completion in ((100, 10), (50, 20)):
        savings.model_call(prompt, 0, completion, prompt * 0.001 + completion * 0.02)
    assert roi.saved_s.value() == pytest.approx(0.3)  # the waiting hit, priced now
    assert savings.warmed_hit("prefix", 64, 8, cached_tokens=32) == pytest.approx(0.032)
    savings.embedding_call(4, 0.2)
    assert savings.warmed_hit("embedding") == pytest.approx(0.05)
    assert roi.saved_s.value() == pytest.approx(0.3 + 0.032 + 0.05)


# -- forecast error -------------------------------------------------------------------------------


def forecast_frame(rows: list[tuple[str, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "tenant": [r[0] for r in rows],
            "key": [r[1] for r in rows],
            "granularity": "5s",
            "step": range(1, len(rows) + 1),
            "bucket_start": pd.to_datetime([r[2] for r in rows], unit="s", utc=True),
            "predicted": [r[3] for r in rows],
        }
    )


def test_mape_compares_predicted_and_seen_demand_per_key_total_and_other() -> None:
    clock = Clock(100.0)
    error = ForecastError(window_s=600.0, clock=clock)
    assert error.mape() == (pytest.approx(math.nan, nan_ok=True), 0)
    clock.now = 110.0
    taken = error.set_forecast(
        forecast_frame([
            ("a", "template:x", 120, 4.0), ("a", "__total__", 120, 10.0),
            ("a", "__other__", 120, 3.0), ("a", "template:y", 120, 2.0),  # y: never seen
            ("a", "template:x", 60, 9.0),  # already started: not a forecast any more
            ("a", "template:x", 180, 1.0),  # not over yet when scored
        ]),
        width_s=60.0,
    )  # fmt: skip
    assert taken == 5
    clock.now = 130.0
    for _ in range(5):
        error.observe("a", "template:x")
    for _ in range(3):
        error.observe("a", "route:completions")
    error.observe("b", "template:x")  # another tenant: counts for b only
    clock.now = 185.0
    mape, points = error.mape()
    # x: |5-4|/5, total: |8-10|/8, other (8-5 seen): 0; y had no request (undefined)
    assert points == 3 and mape == pytest.approx(100 * (0.2 + 0.25 + 0.0) / 3)
    clock.now = 185.0 + 600.0 + 61.0  # the bucket ended more than a window ago
    assert error.mape()[1] == 0


def test_the_gateways_demand_key_is_the_features_key_of_what_it_logs() -> None:
    ids = list(range(40))
    short = list(range(7))
    cases = [("t1", ids, "chat"), (None, ids, "completions"), (None, short, "chat"),
             (None, None, "embeddings")]  # fmt: skip
    frame = pd.DataFrame(
        {
            "template_id": pd.array([c[0] for c in cases], dtype=pd.ArrowDtype(pa.string())),
            "prefix_hashes": pd.array(
                [prefix_hashes(c[1]) for c in cases], dtype=pd.ArrowDtype(pa.list_(pa.int64()))
            ),
            "route": pd.array([c[2] for c in cases], dtype=pd.ArrowDtype(pa.string())),
        }
    )
    expected = demand_keys(frame).tolist()
    ours = [demand_key(t, first_block_hash(i), r) for t, i, r in cases]
    assert ours == expected
    assert ours[1].startswith("prefix:") and ours[2] == "route:chat"


# -- attribution from the warm-up ledgers --------------------------------------------------------


def warm(ledger: WarmLedger, items: list[WarmItem], seconds: float, state: str = "done") -> None:
    ledger.register(items)
    for item in items:
        ledger.begin(item)
        ledger.finish(item, state, WarmResult("hf", 10, 1, 0, seconds, None, "cpu"))


def test_ledgers_mark_what_warm_up_wrote_until_traffic_rewrites_it(tmp_path: Path) -> None:
    computed: list[float] = []
    ledgers = WarmupLedgers(tmp_path, MODEL, tokens, lambda s, at: computed.append(s))
    assert ledgers.refresh() == 0  # no warm-up directory yet
    prompt, prefix = "What is the wire transfer fee? " * 2, "System: you are a bank. " * 3
    ledger = WarmLedger(WarmLedger.path_for(tmp_path, "plan1"), f"hf:{MODEL}")
    warm(ledger, [WarmItem(0, "acme", "response:1", "response", None, "memory", prompt),
                  WarmItem(1, "acme", "kv:p", "kv_prefix", None, "ssd", prefix),
                  WarmItem(2, "acme", "embedding:1", "embedding", None, "ssd", "hello")],
         seconds=0.5)  # fmt: skip
    failed = WarmItem(3, "acme", "response:2", "response", None, "memory", "never stored")
    warm(ledger, [failed], seconds=0.25, state="failed")
    other = WarmLedger(WarmLedger.path_for(tmp_path, "plan2"), "hf:another-model")
    warm(other, [WarmItem(0, "acme", "response:9", "response", None, "memory", "x")], 9.0)
    ledger.close()
    other.close()

    assert ledgers.refresh() == 5 and ledgers.refresh() == 0  # each row is read once
    assert sorted(computed) == [0.25, 0.5, 0.5, 0.5]  # the failed attempt cost too
    response_key = ExactKey.of("acme", MODEL, prompt).to_string()
    assert ledgers.exact_writer(response_key) == "warmup"
    assert ledgers.exact_writer(ExactKey.of("acme", MODEL, "never stored").to_string()) == (
        "traffic"
    )
    assert ledgers.exact_writer(
        EmbeddingKey.of("acme", EMBEDDING_MODEL_ID, "hello").to_string()
    ) == ("warmup")
    assert ledgers.exact_writer(ExactKey.of("beta", MODEL, prompt).to_string()) == "traffic"
    longer = tokens(prefix + "How do I close my account?")
    assert ledgers.prefix_writer("acme", longer, 2 * PAGE_TOKENS) == "warmup"
    assert ledgers.prefix_writer("beta", longer, 2 * PAGE_TOKENS) == "traffic"
    assert ledgers.prefix_writer("acme", tokens("Another start " * 5), 32) == "traffic"

    ledgers.traffic_wrote(response_key)  # the gateway stored it after a miss
    assert ledgers.exact_writer(response_key) == "traffic"
    ledgers.traffic_wrote_pages("acme", longer, PAGE_TOKENS)  # pages 2.. were stored again
    assert ledgers.prefix_writer("acme", longer, PAGE_TOKENS) == "warmup"
    assert ledgers.prefix_writer("acme", longer, 2 * PAGE_TOKENS) == "traffic"

    again = WarmLedger(WarmLedger.path_for(tmp_path, "plan1"), f"hf:{MODEL}")
    warm(again, [WarmItem(4, "acme", "response:3", "response", None, "memory", "later")], 0.125)
    again.close()
    assert ledgers.refresh() == 1 and computed[-1] == 0.125  # only the row finished since
    assert ledgers.exact_writer(ExactKey.of("acme", MODEL, "later").to_string()) == "warmup"


# -- the signals end to end (no server) ----------------------------------------------------------


def make_signals(clock: Clock, wall: Clock, **options: object) -> Signals:
    settings = SignalSettings(**{"window_s": 60.0, "slo_s": 0.5, **options})  # type: ignore[arg-type]
    return Signals(GatewayMetrics(), settings, clock=clock, wall=wall, rng=random.Random(7))


def test_attribution_qps_gain_and_roi_after_a_warm_up_then_traffic(tmp_path: Path) -> None:
    clock, wall = Clock(0.0), Clock(1e9)
    signals = make_signals(clock, wall, value_per_saved_s=3.0, cost_per_compute_s=1.0)
    ledger = WarmLedger(WarmLedger.path_for(tmp_path, "plan"), f"hf:{MODEL}")
    warm(ledger, [WarmItem(0, "acme", "response:1", "response", None, "memory", "warmed")], 0.4)
    ledger.close()
    signals.ledgers = WarmupLedgers(tmp_path, MODEL, tokens, signals.roi.compute_s.add)
    signals.refresh()
    warmed = ExactKey.of("acme", MODEL, "warmed").to_string()
    fresh = ExactKey.of("acme", MODEL, "fresh").to_string()
    clock.now = 10.0
    for prompt, completion in ((40, 8), (100, 4)):  # the model's cost: 0.001/prompt, 0.02/token
        call = served("miss", fresh, prompt_tokens=prompt, completion_tokens=completion,
                      model_s=prompt * 0.001 + completion * 0.02)  # fmt: skip
        signals.generation("acme", "completions", call, None, eligible=True)
    signals.generation("acme", "completions", served("exact-memory", warmed), None, True)
    signals.generation("acme", "completions", served("exact-memory", fresh), None, True)
    signals.generation("acme", "completions", served("semantic-ssd", fresh), None, True)

    m = signals.metrics
    assert m.value("preheat_gateway_attributed_hits_total", kind="exact", writer="warmup") == 1
    assert m.value("preheat_gateway_attributed_hits_total", kind="exact", writer="traffic") == 1
    assert m.value("preheat_gateway_attributed_hits_total", kind="semantic", writer="traffic") == 1
    assert sample(signals, "preheat_gateway_warmup_hit_share") == pytest.approx(1 / 3)
    assert sample(signals, "preheat_gateway_warmup_qps_gain") == pytest.approx(1 / 2)
    assert sample(signals, "preheat_gateway_warmup_qps") == pytest.approx(1 / 10)
    saved = 40 * 0.001 + 8 * 0.02  # the warmed hit's prompt and completion, priced
    assert sample(signals, "preheat_gateway_warmup_value") == pytest.approx(3 * saved)
    assert sample(signals, "preheat_gateway_warmup_cost") == pytest.approx(0.4)
    assert sample(signals, "preheat_gateway_warmup_roi") == pytest.approx((3 * saved - 0.4) / 0.4)
    # a miss on the warmed key means its entry was gone: traffic's from now on
    signals.generation("acme", "completions", served("miss", warmed, model_s=0.1), None, True)
    signals.generation("acme", "completions", served("exact-memory", warmed), None, True)
    assert m.value("preheat_gateway_attributed_hits_total", kind="exact", writer="traffic") == 2


def test_canary_share_cost_share_hit_ratio_sla_and_cold_start() -> None:
    clock, wall = Clock(0.0), Clock(1e9)
    signals = make_signals(clock, wall, canary_share=0.25, tenant_label="name")
    signals.ready(began=-2.0)
    draws = 0
    for i in range(40):
        canary = signals.canary_draw()
        draws += canary
        outcome = "canary" if canary else ("exact-memory" if i % 2 else "miss")
        model_s = 0.0 if outcome == "exact-memory" else 0.1
        if not canary:  # what the chain reports
            signals.lookup("exact")
            if outcome == "exact-memory":
                signals.hit("memory", "exact")
        signals.generation("acme", "chat", served(outcome, "k", model_s=model_s), None, True)
    signals.generation("beta", "chat", served("bypass", model_s=0.3), None, eligible=False)
    clock.now = 5.0
    for seconds in (0.1, 0.2, 0.9, 1.5):
        signals.finished("chat", "miss", seconds)
    signals.finished("chat", "exact-memory", 0.01)
    signals.finished("chat", "error_401", 9.0)  # the client's error: not an SLA breach

    assert 0 < draws < 40
    assert sample(signals, "preheat_gateway_canary_share") == pytest.approx(draws / 40)
    lookups = signals.metrics.value("preheat_gateway_lookups_total", kind="exact")
    hits = signals.metrics.value("preheat_gateway_hits_total", tier="memory", kind="exact")
    assert sample(signals, "preheat_gateway_hit_ratio", "memory", "exact") == hits / lookups
    shares = dict(signals.samples()["preheat_gateway_tenant_cost_share"])
    model_calls = signals.metrics.value("preheat_gateway_model_seconds_total", tenant="acme")
    assert shares[("acme",)] == pytest.approx(model_calls / (model_calls + 0.3))
    assert sum(shares.values()) == pytest.approx(1.0)
    assert sample(signals, "preheat_gateway_sla_violation_ratio", "chat") == pytest.approx(2 / 5)
    assert sample(signals, "preheat_gateway_sla_p95_excess_seconds", "chat") == pytest.approx(1.0)
    assert sample(signals, "preheat_gateway_cold_start_seconds", "load") == pytest.approx(2.0)
    assert sample(signals, "preheat_gateway_cold_start_seconds", "first_request") == 0.1
    assert sample(signals, "preheat_gateway_cold_start_seconds", "first_hit") == pytest.approx(5.0)
    clock.now = 200.0  # everything left the window
    assert math.isnan(sample(signals, "preheat_gateway_canary_share"))


def test_no_canary_without_a_share_and_hashed_tenants_depend_on_the_salt() -> None:
    signals = make_signals(Clock(), Clock())
    assert not any(signals.canary_draw() for _ in range(1000))
    hashed = tenant_label("acme", "hashed")
    assert hashed.startswith("t-") and "acme" not in hashed and len(hashed) == 14
    assert tenant_label("acme", "hashed", "s3cret") not in (hashed, "acme")
    assert tenant_label("acme", "hashed") == hashed and tenant_label("acme", "name") == "acme"


def test_every_metric_is_exported_with_its_help(tmp_path: Path) -> None:
    signals = make_signals(Clock(), Clock())
    signals.generation("acme", "chat", served("miss", "k", model_s=0.1), list(range(20)), True)
    signals.finished("chat", "miss", 0.2)
    signals.feature_load("model", 0.5)
    text = generate_latest(signals.metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, meaning in HELP.items():
        assert families[name].documentation == meaning
    assert set(DERIVED) <= set(HELP)
    assert all(families[name].samples for name in DERIVED if name != "preheat_gateway_hit_ratio")
    rss = [v for (device, source, v) in accelerator_memory() if source.startswith("process")]
    assert rss and rss[0] > 1_000_000


def test_accelerator_memory_reads_cuda_only_where_a_context_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in torch (this machine has no GPU): initialised CUDA devices report allocated
    and reserved bytes with their source; a process that never touched CUDA is not asked."""
    import sys
    import types

    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 2,
        memory_allocated=lambda i: 100.0 * (i + 1), memory_reserved=lambda i: 1000.0 * (i + 1),
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    samples = {(d, s): v for d, s, v in accelerator_memory()}
    assert samples[("cuda:1", "cuda_allocated")] == 200.0
    assert samples[("cuda:0", "cuda_reserved")] == 1000.0
    assert samples[("cpu", "process_rss")] > 0
    cuda.is_initialized = lambda: False
    assert [s for _, s, _ in accelerator_memory()] == ["process_rss"]

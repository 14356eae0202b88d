"""The gateway end to end, what warm-up stored: the responses and KV pages the backend warms are
what the gateway serves, and hits on them are attributed to warm-up and priced. (The setting:
test_gateway.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import Running, complete, metric, start, unique

from cache_runtime.kv_pages import PAGE_TOKENS
from models.serving.embeddings import MiniLM

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


def test_warm_up_responses_and_kv_pages_are_what_the_gateway_serves(
    gw: Running, backend: Any
) -> None:
    """Warm-up writes with the backend into the node cache; the gateway reads the same keys."""
    prompt = unique("Summarise the overdraft policy for premium accounts. " * 4)
    warmed = backend.warm_prefix("acme", prompt, gw.cache, store_response=True)
    source, answer = complete(gw, prompt)  # default max_tokens: warm-up's 16
    longer_source, longer = complete(gw, prompt + " Answer in French.")

    assert source == "exact-memory" and answer.choices[0].text == warmed.response
    assert longer_source == "prefix"
    assert longer.usage.prompt_tokens_details.cached_tokens >= PAGE_TOKENS


def test_hits_on_what_a_warm_up_run_stored_are_attributed_to_it_and_priced(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    """A real warm-up batch (ledger and all) into the gateway's cache, then traffic: hits on
    its entries count for warm-up, hits on traffic's own entries do not; the ROI is the
    formula over the exposed value and cost."""
    from models.warmup.execute import WarmItem, WarmLedger, backend_target, execute_batch

    running, stop = start(backend, minilm, tmp_path / "data", None, semantic=False, refresh_s=0)
    try:
        prompt = unique("Summarise the fees of a premium account.")
        prefix = unique("You are the assistant of a retail bank. Answer briefly. " * 3)
        items = [WarmItem(0, "acme", "response:1", "response", None, "memory", prompt),
                 WarmItem(1, "acme", "kv:1", "kv_prefix", None, "memory", prefix)]  # fmt: skip
        ledger = WarmLedger(WarmLedger.path_for(tmp_path / "data", "plan"), backend_target(backend))
        ledger.register(items)  # (what `open_job` does before the batches run)
        stats = execute_batch(items, backend, running.cache, ledger)
        spent = float(ledger.frame()["seconds"].sum())
        ledger.close()
        assert stats.done == 2
        running.app.state.gateway.signals.refresh()

        fresh = unique("Who can open a junior account?")
        sources = [complete(running, p)[0] for p in (prompt, prefix + " Overdraft?", fresh, fresh)]
        text = httpx.get(f"{running.url}/metrics").text
    finally:
        stop()
    assert sources == ["exact-memory", "prefix", "miss", "exact-memory"]

    def hits(kind: str, writer: str) -> float:
        return metric(text, "preheat_gateway_attributed_hits_total", kind=kind, writer=writer)

    assert hits("exact", "warmup") == 1 and hits("prefix", "warmup") == 1
    assert hits("exact", "traffic") == 1
    assert metric(text, "preheat_gateway_warmup_hit_share") == pytest.approx(2 / 3)
    value = metric(text, "preheat_gateway_warmup_value")
    cost = metric(text, "preheat_gateway_warmup_cost")
    assert cost == pytest.approx(spent, rel=1e-3)  # the ledger's compute seconds (x 1.0)
    assert value > 0
    assert metric(text, "preheat_gateway_warmup_roi") == pytest.approx((value - cost) / cost)
    # two model calls (the prefix hit and the miss), one warmed exact hit
    assert metric(text, "preheat_gateway_warmup_qps_gain") == pytest.approx(1 / 2)

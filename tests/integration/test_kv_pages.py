"""KV pages round trip: generation continued from restored pages matches a full forward."""

from __future__ import annotations

import pytest

from cache_runtime.hybrid import HybridCache
from cache_runtime.kv_pages import (
    PAGE_TOKENS,
    decode_page,
    encode_page,
    kv_cache_of,
    load_prefix,
    page_keys,
    store_prefix,
    stream_prefix,
)
from cache_runtime.tiers import MemoryTier

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_and_tokens():
    from models.tiny_llm import build_tiny_gpt2

    torch.set_num_threads(1)
    model, tokenizer = build_tiny_gpt2(seed=3)
    text = "Summarise this filing for a credit analyst: revenue grew while margins fell. " * 8
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"][:70]
    assert len(tokens) == 70  # four full pages and a partial tail of 6 tokens
    return model, tokens


def test_pages_are_safetensors_not_pickle(model_and_tokens) -> None:
    layers = [(torch.randn(1, 4, PAGE_TOKENS, 16), torch.randn(1, 4, PAGE_TOKENS, 16))]
    data = encode_page(layers)
    assert not data.startswith(b"\x80")  # a pickle stream starts with PROTO 0x80
    back = decode_page(data)
    assert torch.equal(back[0][0], layers[0][0]) and torch.equal(back[0][1], layers[0][1])


def test_continuing_from_restored_pages_matches_full_forward(model_and_tokens) -> None:
    model, tokens = model_and_tokens
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    ids = torch.tensor([tokens])
    with torch.no_grad():
        full = model(ids, use_cache=True)
        assert (
            store_prefix(cache, "acme", "tiny-gpt2", tokens, full.past_key_values) == 4
        )  # 70 // 16
        restored, cached = load_prefix(cache, "acme", "tiny-gpt2", tokens, model.config)
        assert cached == 64 and restored.get_seq_length() == 64
        continued = model(ids[:, cached:], cache=restored, use_cache=True)
    torch.testing.assert_close(continued.logits[:, -1], full.logits[:, -1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(continued.logits, full.logits[:, cached:], rtol=1e-5, atol=1e-5)


def test_a_prefix_of_several_read_ahead_chunks_is_restored_whole(model_and_tokens) -> None:
    """20 pages, read ahead in chunks of 2, 4, 8 and 6: every token of every layer lands where
    the full forward has it."""
    model, _ = model_and_tokens
    torch.manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (20 * PAGE_TOKENS + 5,)).tolist()
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    ids = torch.tensor([tokens])
    with torch.no_grad():
        full = model(ids, use_cache=True)
        assert store_prefix(cache, "acme", "tiny-gpt2", tokens, full.past_key_values) == 20
        restored, cached = load_prefix(cache, "acme", "tiny-gpt2", tokens, model.config)
        assert cached == 20 * PAGE_TOKENS
        for got, want in zip(restored.layers, full.past_key_values.layers, strict=True):
            assert torch.equal(got.keys, want.keys[:, :, :cached])
            assert torch.equal(got.values, want.values[:, :, :cached])
        continued = model(ids[:, cached:], cache=restored, use_cache=True)
    torch.testing.assert_close(continued.logits, full.logits[:, cached:], rtol=1e-5, atol=1e-5)


def test_a_restored_cache_holds_the_loaded_tensors_not_a_copy(model_and_tokens) -> None:
    model, tokens = model_and_tokens
    ids = torch.tensor([tokens])
    with torch.no_grad():
        full = model(ids, use_cache=True)
        layers = [(layer.keys[:, :, :64].clone(), layer.values[:, :, :64].clone())
                  for layer in full.past_key_values.layers]  # fmt: skip
        kv = kv_cache_of(layers, model.config)
        assert [layer.keys.data_ptr() for layer in kv.layers] == [k.data_ptr() for k, _ in layers]
        assert kv.get_seq_length() == 64
        continued = model(ids[:, 64:], cache=kv, use_cache=True)
    torch.testing.assert_close(continued.logits, full.logits[:, 64:], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="1 layers of KV for a model of 2"):
        kv_cache_of(layers[:1], model.config)


def test_longest_prefix_is_used_and_other_tenants_get_nothing(model_and_tokens) -> None:
    model, tokens = model_and_tokens
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    with torch.no_grad():
        kv = model(torch.tensor([tokens[:40]]), use_cache=True).past_key_values
    assert store_prefix(cache, "acme", "tiny-gpt2", tokens[:40], kv) == 2
    diverging = tokens[:20] + [7] * 50  # shares the first page only
    _, cached = load_prefix(cache, "acme", "tiny-gpt2", diverging, model.config)
    assert cached == 16
    assert load_prefix(cache, "globex", "tiny-gpt2", tokens, model.config) == (None, 0)
    assert load_prefix(cache, "acme", "other-model", tokens, model.config) == (None, 0)


def test_pages_stream_in_order_and_stop_at_a_hole(model_and_tokens) -> None:
    model, tokens = model_and_tokens
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    with torch.no_grad():
        kv = model(torch.tensor([tokens]), use_cache=True).past_key_values
    store_prefix(cache, "acme", "tiny-gpt2", tokens, kv)
    keys = page_keys("acme", "tiny-gpt2", tokens)
    cache.delete(keys[2])  # a hole: pages after it are unusable
    streamed = stream_prefix(cache, "acme", "tiny-gpt2", tokens)
    first = next(streamed)  # usable before the rest has been fetched
    assert first.key == keys[0] and first.layers[0][0].shape == (1, 4, PAGE_TOKENS, 16)
    assert [p.key.depth for p in streamed] == [1]


def test_a_sessions_pages_are_cooled_when_it_ends_but_not_pages_another_session_read(
    model_and_tokens,
) -> None:
    model, tokens = model_and_tokens
    with torch.no_grad():
        kv = model(torch.tensor([tokens]), use_cache=True).past_key_values
    keys = [key.to_string() for key in page_keys("acme", "tiny-gpt2", tokens)]
    tier = MemoryTier(64 * 1024 * 1024, policy="lru")
    cache = HybridCache([tier])
    assert store_prefix(cache, "acme", "tiny-gpt2", tokens, kv, session="chat-1") == 4
    # another chat reads the first two pages (a shared system prompt)
    assert len(list(stream_prefix(cache, "acme", "tiny-gpt2", tokens[:40], session="chat-2"))) == 2
    assert cache.end_session("acme", "chat-1") == 2
    order = list(tier.policy._order)  # type: ignore[attr-defined]
    assert order[:2] == keys[2:4][::-1]  # chat-1's own pages are the next to go
    assert cache.end_session("acme", "chat-2") == 0  # it only read pages chat-1 read first


def test_a_follow_up_turns_pages_go_in_as_a_live_conversation(model_and_tokens) -> None:
    """turn >= 1: the body pages sit on the policy's reused side (ARC's T2); the prompt's last
    page stays a cold tail; a first turn's pages start on the seen-once side (T1)."""
    model, tokens = model_and_tokens
    with torch.no_grad():
        kv = model(torch.tensor([tokens]), use_cache=True).past_key_values
    keys = [key.to_string() for key in page_keys("acme", "tiny-gpt2", tokens)]
    for turn, body_protected in ((0, False), (1, True)):
        tier = MemoryTier(64 * 1024 * 1024, policy="prefix-arc")
        assert store_prefix(HybridCache([tier]), "acme", "tiny-gpt2", tokens, kv, turn=turn) == 4
        reused_side = tier.policy._t2  # type: ignore[attr-defined]
        assert all((key in reused_side) == body_protected for key in keys[:-1])
        assert keys[-1] not in reused_side
    with pytest.raises(ValueError, match="turn"):
        store_prefix(HybridCache([MemoryTier(1024)]), "acme", "tiny-gpt2", tokens, kv, turn=-1)


def test_a_kv_cache_shorter_than_the_tokens_stores_only_its_full_pages(model_and_tokens) -> None:
    """Regression: after generate() the cache holds one token fewer than prompt and output;
    the page past its end was stored short, under the key of a whole one, and load_prefix
    then claimed 16 tokens it did not hold (continuing from it gave wrong logits)."""
    model, tokens = model_and_tokens
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    with torch.no_grad():
        out = model.generate(
            torch.tensor([tokens[:40]]),
            max_new_tokens=8,
            do_sample=False,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        sequence = out.sequences[0].tolist()
        assert len(sequence) == 48 and out.past_key_values.get_seq_length() == 47
        assert store_prefix(cache, "acme", "tiny-gpt2", sequence, out.past_key_values) == 2
        assert [
            p.layers[0][0].shape[2] for p in stream_prefix(cache, "acme", "tiny-gpt2", sequence)
        ] == [PAGE_TOKENS] * 2
        restored, cached = load_prefix(cache, "acme", "tiny-gpt2", sequence, model.config)
        assert cached == 32 and restored.get_seq_length() == 32
        ids = torch.tensor([sequence])
        full = model(ids, use_cache=True)
        continued = model(ids[:, cached:], cache=restored, use_cache=True)
    torch.testing.assert_close(continued.logits, full.logits[:, cached:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("damage", ["short", "float16", "one_layer", "not_safetensors"])
def test_a_page_that_is_not_whole_ends_the_prefix_and_is_counted(
    model_and_tokens, damage: str
) -> None:
    """A cached page that is short, of another dtype or layer count than the first page, or
    not a page at all is a miss from there on, counted and deleted; it is never concatenated."""
    model, tokens = model_and_tokens
    cache = HybridCache([MemoryTier(64 * 1024 * 1024)])
    with torch.no_grad():
        kv = model(torch.tensor([tokens]), use_cache=True).past_key_values
    assert store_prefix(cache, "acme", "tiny-gpt2", tokens, kv) == 4
    keys = page_keys("acme", "tiny-gpt2", tokens)
    whole = [(layer.keys[:, :, 32:48], layer.values[:, :, 32:48]) for layer in kv.layers]
    bad = {
        "short": lambda: encode_page([(k[:, :, :15], v[:, :, :15]) for k, v in whole]),
        "float16": lambda: encode_page([(k.half(), v.half()) for k, v in whole]),
        "one_layer": lambda: encode_page(whole[:1]),
        "not_safetensors": lambda: b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!",
    }[damage]()
    assert cache.put(keys[2], bad, parent=keys[1])
    restored, cached = load_prefix(cache, "acme", "tiny-gpt2", tokens, model.config)
    assert cached == 32 and restored.get_seq_length() == 32
    errors = cache.metrics.value("preheat_cache_errors_total", tier="memory", op="kv_page")
    assert errors == 1
    # deleted (with the page after it), so the next prefill can store it whole again
    assert cache.longest_prefix(keys) == 2
    assert [p.key.depth for p in stream_prefix(cache, "acme", "tiny-gpt2", tokens)] == [0, 1]
    if damage in ("short", "not_safetensors"):  # wrong on its own, not only beside page 0
        with pytest.raises(ValueError):
            decode_page(bad)

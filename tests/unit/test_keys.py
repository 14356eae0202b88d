"""Key properties: exact round trip, and no match across tenants, models or format versions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache_runtime.keys import (
    KEY_FORMAT_VERSION,
    ExactKey,
    PrefixKey,
    SemanticKey,
    normalise_prompt,
    parse_key,
)

names = st.text(min_size=1, max_size=40)  # any unicode, "|" and "%" included
blocks = st.lists(st.lists(st.integers(0, 50_000), min_size=1, max_size=16), min_size=1, max_size=6)
exact_keys = st.builds(ExactKey.of, names, names, st.text(max_size=200))
semantic_keys = st.builds(SemanticKey, names, names, st.integers(0, 2**64 - 1))
hashes64 = st.integers(-(2**63), 2**63 - 1)
prefix_keys = st.builds(
    lambda t, m, d, h, r: PrefixKey(t, m, d, h, h if d == 0 else r),
    names, names, st.integers(0, 10_000), hashes64, hashes64,
)  # fmt: skip
any_key = st.one_of(exact_keys, semantic_keys, prefix_keys)


@given(any_key)
def test_string_round_trip(key: ExactKey | SemanticKey | PrefixKey) -> None:
    text = key.to_string()
    assert type(key).from_string(text) == key
    assert parse_key(text) == key


@given(any_key, any_key)
def test_equal_strings_iff_equal_keys(a: object, b: object) -> None:
    assert (a.to_string() == b.to_string()) == (a == b)


@given(names, names, names, st.text(max_size=100))
def test_exact_keys_never_match_across_tenants_or_models(
    t1: str, t2: str, model: str, prompt: str
) -> None:
    if t1 != t2:
        assert (
            ExactKey.of(t1, model, prompt).to_string() != ExactKey.of(t2, model, prompt).to_string()
        )
        assert (
            ExactKey.of(model, t1, prompt).to_string() != ExactKey.of(model, t2, prompt).to_string()
        )


@given(names, names, names, blocks)
def test_prefix_chains_never_match_across_tenants_or_models(
    t1: str, t2: str, model: str, bs: list
) -> None:
    if t1 != t2:
        a, b = PrefixKey.chain(t1, model, bs), PrefixKey.chain(t2, model, bs)
        assert {k.block_hash for k in a}.isdisjoint(k.block_hash for k in b)
        c = PrefixKey.chain(model, t1, bs)
        d = PrefixKey.chain(model, t2, bs)
        assert not {k.to_string() for k in c} & {k.to_string() for k in d}


@given(any_key)
def test_keys_never_match_across_format_versions(key: object) -> None:
    other = type(key)(**{**{f: getattr(key, f) for f in key.__slots__}, "version": key.version + 1})
    assert other != key and other.to_string() != key.to_string()
    assert type(key).from_string(other.to_string()).version == KEY_FORMAT_VERSION + 1


@given(names, names, blocks, blocks)
def test_prefix_chain_shares_exactly_the_common_blocks(
    tenant: str, model: str, a: list, b: list
) -> None:
    ka, kb = PrefixKey.chain(tenant, model, a), PrefixKey.chain(tenant, model, b)
    assert all(k.root_hash == ka[0].block_hash for k in ka)
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    assert ka[:common] == kb[:common]
    assert all(x != y for x, y in zip(ka[common:], kb[common:], strict=False))


def test_normalisation_is_whitespace_only() -> None:
    assert normalise_prompt("  Sell\n\tACME   now ") == "Sell ACME now"
    assert ExactKey.of("t", "m", "Sell ACME") == ExactKey.of("t", "m", " Sell  ACME\n")
    assert ExactKey.of("t", "m", "Sell ACME") != ExactKey.of("t", "m", "sell acme")
    assert ExactKey.of("t", "m", "e\u0301") == ExactKey.of("t", "m", "\u00e9")  # NFC


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ph|v1|exact|a|b",
        "ph|v1|exact|a|b|c|d",
        "xx|v1|exact|a|b|c",
        "ph|1|exact|a|b|c",
        "ph|v1|exact||b|c",
        "ph|v1|semantic|a|b|zz",
        "ph|v1|prefix|a|b|-1|5|5",
        "ph|v1|prefix|a|b|1|0x5|5",
        "ph|v1|prefix|a|b|0|5|6",
        "ph|v1|prefix|a|b|1|5",
        "ph|v1|nope|a|b|c",
    ],
)
def test_malformed_strings_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_key(text)


def test_field_values_are_validated() -> None:
    with pytest.raises(ValueError):
        SemanticKey("t", "tpl", 2**64)
    with pytest.raises(ValueError):
        PrefixKey("t", "m", -1, 0, 0)
    with pytest.raises(ValueError, match="non-empty"):
        ExactKey("", "m", "d").to_string()

"""Entity guards: each category tells its entities apart and lets equal ones through."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.templates.guards import guard_violations, guards_pass


@pytest.mark.parametrize(
    ("a", "b", "category"),
    [
        ("send 100 dollars to savings", "send 1000 dollars to savings", "number"),
        ("send $100 to savings", "send 100 euros to savings", "money"),
        ("send $100 to savings", "send $1,000 to savings", "money"),
        ("5k users", "5m users", "number"),
        ("tell me two things", "tell me three things", "number"),
        ("balance on 2024-03-01", "balance on 2024-03-02", "date"),
        ("revenue in March", "revenue in April", "date"),
        ("revenue on May 5", "revenue on June 5", "date"),
        ("meeting next Monday", "meeting next Tuesday", "date"),
        ("results for Q3", "results for Q4", "date"),
        ("a rate of 5%", "a rate of 50%", "percent"),
        ("a rate of 5%", "a rate of 5 basis points", "percent"),
        ("status of order #48213", "status of order #48231", "identifier"),
        ("balance of account AB123", "balance of account AC123", "identifier"),
        ("what is AAPL trading at", "what is MSFT trading at", "ticker"),
        ("buy $TSLA today", "buy $NVDA today", "ticker"),
        ("should I do it", "should I not do it", "negation"),
        ("is this covered", "isn't this covered", "negation"),
        ("can I sell now", "cannot I sell now", "negation"),
    ],
)
def test_each_category_tells_entities_apart(a: str, b: str, category: str) -> None:
    assert category in guard_violations(a, b)
    assert not guards_pass(a, b) and not guards_pass(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("send $100 to savings", "send 100 dollars to savings"),
        ("send $100 to savings", "Send USD 100 to savings!"),
        ("what is 1,000,000", "what is 1000000"),
        ("tell me two things", "tell me 2 things"),
        ("who was the first president", "who was the 1st president"),
        ("balance on 2024-03-01", "balance on 2024-3-1"),
        ("a rate of 5%", "a rate of 5 percent"),
        ("status of order #12345", "Status of order # 12345?"),
        ("account ACC-1234 balance", "account acc1234 balance"),
        ("what is AAPL's price", "What is aapl's price"),
        ("WHAT IS THE PRICE OF GOLD", "what is the price of gold"),
        ("why don't rates fall", "why dont rates fall"),
        ("why don\u2019t rates fall", "why don't rates fall"),
        ("may I see the account no. 5 statement", "May I see the account no 5 statement"),
    ],
)
def test_equal_entities_pass(a: str, b: str) -> None:
    assert guard_violations(a, b) == []


tokens = st.sampled_from(
    [
        "transfer", "the", "balance", "$1,200", "100", "dollars", "5%", "2.5", "percent",
        "2024-03-01", "March", "may", "Monday", "Q3", "AAPL", "$MSFT", "order", "#4821",
        "ACC-77", "not", "don't", "never", "two", "million", "EUR", "is", "it",
    ]
)  # fmt: skip


@given(st.lists(tokens, min_size=1, max_size=12), st.data())
def test_guards_ignore_whitespace_case_and_sentence_punctuation(
    words: list[str], data: st.DataObject
) -> None:
    text = " ".join(words)
    gaps = [data.draw(st.sampled_from([" ", "  ", "\t", " \n "])) for _ in words[1:]]
    noisy = words[0] + "".join(g + w for g, w in zip(gaps, words[1:], strict=True))
    noisy = data.draw(st.sampled_from([str.lower, str.upper, str.title, lambda s: s]))(noisy)
    noisy += data.draw(st.sampled_from(["", "?", "!", "."]))
    assert guard_violations(text, noisy) == []

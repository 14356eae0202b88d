"""The content-word guard and the entity-substitution set: near-misses vetoed, paraphrases kept."""

from __future__ import annotations

from collections import Counter

import pytest

from models.templates.content_guard import content_words, content_words_agree, directions
from models.templates.guards import guard_violations, guards_pass
from models.templates.pairs import load_corpus
from models.templates.substitutions import CATEGORIES, build_substitution_pairs

NEAR_MISSES = [
    ("What is the ATM limit for gold cards?", "What is the ATM limit for silver cards?"),
    ("How do I convert USD to EUR?", "How do I convert EUR to USD?"),
    ("What is the rate from dollars into euros?", "What is the rate from euros into dollars?"),
    ("Is the savings rate higher this year?", "Is the savings rate lower this year?"),
    ("Should I buy bonds now?", "Should I sell bonds now?"),
    ("How do I open my savings account?", "How do I close my savings account?"),
    ("Will rates increase?", "Will rates decrease?"),
    ("What did I spend this month?", "What did I spend last month?"),
    ("Can I send USD and have it arrive as GBP?", "Can I send GBP and have it arrive as USD?"),
    ("Is gold better than silver?", "Is silver better than gold?"),
    ("What is the interest on a car loan?", "What is the interest on a student loan?"),
    ("What are the fees for cash in London?", "What are the fees for cash in Paris?"),
    ("What are the rates?", "What are the dates?"),  # one letter off, but not a typo of it
    ("When did the war begin?", "Where did the war begin?"),
    ("What does life insurance cover?", "What does insurance cover?"),
    ("How long is the great wall of china?", "How long is the great china?"),  # not "will"
    ("Why is my card blocked?", "How is my card blocked?"),
]  # fmt: skip
PARAPHRASES = [
    ("How do I reset my online banking password?", "How can I reset my online banking password?"),
    ("What is the capital of australia", "tell me the capital of australia please"),
    ("What is the daily ATM limit for gold cards?", "what's the daily atm limit for gold card"),
    ("What is the ATM limit for silver cards?", "What is the ATM limit for sliver cards"),
    ("who wrote pride and prejudice", "who is the author of pride and prejudice"),
    ("how many seasons of the office are there", "what is the number of seasons of the office"),
    ("when did the first world war begin", "at what time did the first world war start"),
    ("what is the largest planet", "what is the biggest planet"),
    ("Explain compound interest.", "Could you explain compound interest?"),
    ("I want you to act as a math teacher.", "I wsnt you to act as a math teacher."),
    ("what does a central bank do", "what does a central bank do thhanks"),
]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), NEAR_MISSES)
def test_a_changed_entity_direction_or_comparative_is_vetoed(a: str, b: str) -> None:
    assert not content_words_agree(a, b) and not content_words_agree(b, a)
    assert "content" in guard_violations(a, b)


@pytest.mark.parametrize(("a", "b"), PARAPHRASES)
def test_a_paraphrase_keeps_its_content_words(a: str, b: str) -> None:
    assert content_words_agree(a, b) and content_words_agree(b, a)
    assert guards_pass(a, b)


def test_what_the_guard_reads() -> None:
    assert content_words("Could you tell me the ATM limits for Gold cards, please?") == {
        "atm", "limit", "gold", "card",
    }  # fmt: skip
    assert directions("convert USD/EUR") == {("usd", "eur")}
    assert directions("transfer from savings to checking") >= {("saving", "checking")}


def test_the_substitution_set_is_large_varied_seeded_and_all_different_questions() -> None:
    corpus = load_corpus(None)
    pairs = build_substitution_pairs(corpus, per_category=30, seed=3)
    kinds = Counter(p.kind for p in pairs)
    assert len(pairs) >= 300 and len(kinds) == len(CATEGORIES) >= 10
    assert all(n == 30 for n in kinds.values()) and all(p.label == 0 for p in pairs)
    assert len({(p.text_a, p.text_b) for p in pairs}) == len(pairs)
    assert pairs == build_substitution_pairs(corpus, per_category=30, seed=3)
    assert pairs != build_substitution_pairs(corpus, per_category=30, seed=4)
    assert [p for p in pairs if guards_pass(p.text_a, p.text_b)] == []

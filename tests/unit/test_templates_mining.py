"""Template mining: exact extraction, one-offs, `assign`, stable ids, quality, bad input.

The embedder is a fake (a hashed bag of words) except in the one test marked for the real MiniLM:
the behaviour under test is the structure and the bookkeeping, and a bag of words keeps a
constant and its over-shoots ("...analyst: who") close, as MiniLM does.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from models.templates.ids import content_id, stable_ids
from models.templates.mined import MinedTemplates
from models.templates.mining import MiningConfig, mine_templates
from models.templates.pattern import Pattern
from models.templates.quality import template_quality
from models.templates.tokens import tokenize

VOCAB = (
    "amber",
    "basalt",
    "cedar",
    "dune",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "iris",
    "jasper",
    "kelp",
    "lagoon",
    "marble",
    "nectar",
    "onyx",
    "pebble",
    "quartz",
    "reef",
    "sierra",
    "tundra",
    "umber",
    "velvet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
    "alder",
    "birch",
    "coral",
    "delta",
    "estuary",
    "flint",
    "glacier",
    "heath",
    "inlet",
    "juniper",
    "knoll",
    "larch",
    "meadow",
    "nimbus",
    "orchard",
    "prairie",
    "quarry",
    "ridge",
    "summit",
    "thicket",
    "upland",
    "valley",
    "wetland",
    "yew",
    "zinc",
    "atoll",
    "bluff",
    "canyon",
)
TEMPLATES = {
    "Summarise this filing for a credit analyst: <*>": 9,
    "Compare <*> with <*> and say which one is riskier.": 7,
    "<*>\n\nTranslate the text above into French.": 6,
}


def fake_embed(texts: list[str]) -> np.ndarray:
    """A hashed bag of words: texts sharing most words are close, as with MiniLM."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in tokenize(text).words:
            out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _filler(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(VOCAB, size=int(rng.integers(4, 9))))


def workload(seed: int = 0, one_offs: int = 8) -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(seed)
    prompts, labels = [], []
    for label, (template, count) in enumerate(TEMPLATES.items()):
        for _ in range(count):
            pieces = template.split("<*>")
            text = pieces[0] + "".join(_filler(rng) + piece for piece in pieces[1:])
            prompts.append(text)
            labels.append(label)
    for _ in range(one_offs):
        prompts.append(_filler(rng).capitalize() + "?")
        labels.append(-1)
    order = rng.permutation(len(prompts))
    return [prompts[i] for i in order], [labels[i] for i in order]


@pytest.fixture(scope="module")
def mined() -> tuple[list[str], list[int], MinedTemplates]:
    prompts, labels = workload()
    return prompts, labels, mine_templates(prompts, embed=fake_embed)


def test_tokens_ignore_case_and_spacing_and_keep_spans() -> None:
    tokens = tokenize("Summarise  THIS:\nnow")
    assert tokens.words == ("summarise", "this", ":", "now")
    assert tokens.text[slice(*tokens.spans[1])] == "THIS"


def test_extracts_exact_constant_text_and_slots(mined) -> None:  # type: ignore[no-untyped-def]
    _, _, result = mined
    found = {t.constant_text: (t.slots, t.volume) for t in result.templates}
    assert found == {
        "Summarise this filing for a credit analyst: <*>": (1, 9),
        "Compare <*> with <*> and say which one is riskier.": (2, 7),
        "<*> Translate the text above into French.": (1, 6),
    }
    assert [t.volume for t in result.top(2)] == [9, 7]


def test_one_offs_stay_unassigned(mined) -> None:  # type: ignore[no-untyped-def]
    prompts, labels, result = mined
    for prompt, label, got in zip(prompts, labels, result.labels, strict=True):
        assert (got is None) == (label == -1), prompt
    assert result.assign("Which meadow glacier summit is the highest?") is None
    assert result.coverage == pytest.approx(22 / 30)


def test_assign_agrees_with_mining_and_generalises(mined) -> None:  # type: ignore[no-untyped-def]
    prompts, _, result = mined
    assert [result.assign(p) for p in prompts] == result.labels
    summarise = next(t for t in result.templates if t.constant_text.startswith("Summarise"))
    unseen = "summarise this filing  for a CREDIT analyst : a brand new filing text"
    assert result.assign(unseen) == summarise.template_id
    assert result.assign("Summarise this filing for a credit analyst:") is None  # empty slot


def test_ids_stay_stable_when_prompts_are_added() -> None:
    prompts, _ = workload(seed=0)
    first = mine_templates(prompts, embed=fake_embed)
    previous = {t.template_id: t.constant_text for t in first.templates}
    more, _ = workload(seed=1, one_offs=3)
    extra = [f"List the covenants in this loan agreement: {w} {w}" for w in VOCAB[:6]]
    second = mine_templates(prompts + more[:10] + extra, embed=fake_embed, previous=previous)
    ids = {t.constant_text: t.template_id for t in second.templates}
    for template_id, text in previous.items():
        assert ids[text] == template_id
    assert ids["List the covenants in this loan agreement: <*>"] not in previous


def test_a_barely_changed_template_keeps_its_id() -> None:
    old = Pattern.parse("You are a careful assistant of the bank. Answer the question: <*>")
    new = Pattern.parse("You are a careful assistant of our bank. Answer the question: <*>")
    other = Pattern.parse("Classify this card transaction as fraud or not: <*>")
    ids = stable_ids([other, new], {"tpl-old": "<*>".join(["You are a careful assistant of "
                     "the bank. Answer the question: ", ""])})  # fmt: skip
    assert ids == [content_id(other), "tpl-old"]
    assert stable_ids([new], {"tpl-old": "Completely different words here: <*>"}) == [
        content_id(new)
    ]
    assert content_id(old) != content_id(new)


def test_table_round_trip_rebuilds_the_same_assigner(mined) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    prompts, _, result = mined
    frame = result.to_frame("acme", pd.Timestamp("2024-03-04T00:00:00Z"))
    assert list(frame.columns)[:3] == ["template_id", "tenant", "constant_text"]
    rebuilt = MinedTemplates.from_frame(frame)
    assert [rebuilt.assign(p) for p in prompts] == result.labels


def test_pattern_slots_need_a_token_and_keep_order() -> None:
    pattern = Pattern.parse("Compare <*> with <*> and say which one is riskier.")
    assert pattern.slots == 2 and not pattern.leading_slot and not pattern.trailing_slot
    words = tokenize("compare apples with pears and say which one is riskier.").words
    assert pattern.match(words)
    assert not pattern.match(tokenize("compare with pears and say which one is riskier.").words)
    assert not pattern.match(tokenize("compare a and say which one is riskier. with b").words)
    with pytest.raises(ValueError, match="two slots"):
        Pattern.parse("Compare <*><*> now")


def test_quality_on_a_known_case() -> None:
    truth = [0, 0, 0, 1, 1, 1, -1, -1]
    vectors = np.array([[1, 0]] * 3 + [[0, 1]] * 3 + [[1, 1]] * 2, dtype=float)
    perfect = template_quality(truth, ["a", "a", "a", "b", "b", "b", None, None], vectors)
    assert perfect["ari"] == pytest.approx(1.0) and perfect["nmi"] == pytest.approx(1.0)
    assert (perfect["clusters"], perfect["coverage"]) == (2, 0.75)
    assert perfect["silhouette"] == pytest.approx(1.0)
    merged = template_quality(truth, ["a"] * 8, None)  # one-offs merged in: penalised
    assert merged["ari"] < 0.5 and merged["silhouette"] is None
    unlabeled = template_quality(None, ["a", None, "a"], None)
    assert "ari" not in unlabeled and unlabeled["coverage"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("prompts", "error", "message"),
    [
        ([], ValueError, "no prompts to mine"),
        (["fine", 3], TypeError, "prompt 1 is a int, not a str"),
        ("one string", TypeError, "not one str"),
    ],
)
def test_bad_input_is_refused(prompts, error, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        mine_templates(prompts, embed=fake_embed)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown method 'kmeans'"):
        MiningConfig(method="kmeans")
    with pytest.raises(ValueError, match="min_support"):
        MiningConfig(min_support=1)

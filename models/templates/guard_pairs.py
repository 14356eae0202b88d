"""Guard pairs: a prompt and a copy differing only in one guarded entity (label 0).

An amount, a date, an account or order number, a ticker, a percentage or a negation: changes
embeddings barely see, which the entity guards (`guards.py`) are for. They are kept out of
calibration (they would make the threshold look safer than it is).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from models.templates.pair_corpus import Corpus, Pair

_AUXILIARIES = re.compile(r"\b(is|are|was|were|does|do|did|can|will|should|has|have)\b", re.I)
_TICKERS = ("AAPL", "MSFT", "TSLA", "NVDA", "AMZN", "GOOGL", "META", "JPM", "BRK.B", "XOM")
_CURRENCY = ("${}", "{} dollars", "EUR {}", "£{}")


def _amount_pair(rng: random.Random) -> tuple[str, str]:
    x = rng.choice((50, 100, 250, 1200, 5000, 10_000, 75_000))
    y = rng.choice((x * 10, x + 1, x // 2, x * 2))
    form = rng.choice(_CURRENCY)
    show = (lambda v: f"{v:,}") if rng.random() < 0.5 else str
    clause = rng.choice(("with a budget of {}", "for a payment of {}", "if I transfer {}"))
    return clause.format(form.format(show(x))), clause.format(form.format(show(y)))


def _date_pair(rng: random.Random) -> tuple[str, str]:
    year, month, day = rng.randrange(2015, 2027), rng.randrange(1, 13), rng.randrange(1, 28)
    shapes = (
        lambda d: f"as of {year}-{month:02d}-{d:02d}", lambda d: f"on {month}/{d}/{year}",
        lambda d: f"on {('January', 'March', 'June', 'October')[d % 4]} {day}, {year}",
        lambda d: f"next {('Monday', 'Tuesday', 'Wednesday', 'Friday')[d % 4]}",
    )  # fmt: skip
    shape = rng.choice(shapes)
    return shape(day), shape(day + 1)


def _identifier_pair(rng: random.Random) -> tuple[str, str]:
    n = rng.randrange(10_000, 99_999)
    m = n + rng.choice((1, 10, 9000)) if rng.random() < 0.7 else int(str(n)[::-1])
    form = rng.choice(("for order #{}", "for account ACC-{}", "about invoice INV{}", "ticket {}"))
    return form.format(n), form.format(m if m != n else n + 1)


def _ticker_pair(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(_TICKERS, 2)
    form = rng.choice(("regarding {} stock", "for ${}", "comparing it with {} shares"))
    return form.format(a), form.format(b)


def _percent_pair(rng: random.Random) -> tuple[str, str]:
    x = rng.choice((1, 2.5, 3, 5, 7.5, 10, 25))
    y = rng.choice((x * 10, x + 1, x / 2))
    form = rng.choice(("assuming a {}% rate", "if prices rise {} percent", "at {} pct interest"))
    return form.format(f"{x:g}"), form.format(f"{y:g}")


_CLAUSES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "amount": _amount_pair, "date": _date_pair, "identifier": _identifier_pair,
    "ticker": _ticker_pair, "percent": _percent_pair,
}  # fmt: skip
_NEGATE = {"can": "cannot", "will": "will not", "do": "do not", "does": "does not"}


def _negated(text: str) -> str | None:
    """`text` with its first auxiliary verb negated ("is" -> "is not"); None without one."""
    match = _AUXILIARIES.search(text)
    if match is None:
        return None
    word = match.group()
    negated = _NEGATE.get(word.lower(), f"{word.lower()} not")
    return text[: match.start()] + negated + text[match.end() :]


def build_guard_pairs(corpus: Corpus, per_category: int = 100, seed: int = 0) -> list[Pair]:
    """Label-0 pairs differing only in one guarded entity: a shipped prompt with an amount, date,
    identifier, ticker or percentage clause (two values), or with a negation added. NQ questions
    that name a year also get the year moved (a "date" pair in their own words)."""
    rng = random.Random(seed)
    pairs: list[Pair] = []
    for category, make in _CLAUSES.items():
        for _ in range(per_category):
            base = rng.choice(corpus.prompts).rstrip("?.!")
            clause_a, clause_b = make(rng)
            pairs.append(Pair(f"{base} {clause_a}?", f"{base} {clause_b}?", 0, f"guard:{category}"))
    with_year = [p for p in corpus.prompts if re.search(r"\b(1[89]|20)\d\d\b", p)]
    for text in rng.sample(with_year, min(per_category // 2, len(with_year))):
        moved = re.sub(r"\b((?:1[89]|20)\d\d)\b", lambda m: str(int(m.group()) + 1), text, count=1)
        pairs.append(Pair(text, moved, 0, "guard:date"))
    negatable = [p for p in corpus.prompts if _negated(p) is not None]
    for text in rng.sample(negatable, min(per_category, len(negatable))):
        pairs.append(Pair(text, _negated(text) or text, 0, "guard:negation"))
    rng.shuffle(pairs)
    return pairs

"""Positive pairs: a prompt and a rewrite that keeps its meaning (label 1).

Each perturbation is one named rewrite (`PERTURBATIONS`): case / whitespace / punctuation, a
one-character typo in a word no guard reads, polite fillers, synonyms from a small list, and
rephrasings; `positive` applies one or two of them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from models.templates.guards import guards_pass
from models.templates.pair_corpus import Pair

_SYNONYMS = (
    ("movie", "film"), ("largest", "biggest"), ("begin", "start"), ("began", "started"),
    ("buy", "purchase"), ("create", "make"), ("created", "made"), ("author", "writer"),
    ("country", "nation"), ("car", "automobile"), ("doctor", "physician"), ("kids", "children"),
    ("help", "assist"), ("fix", "repair"), ("big", "large"), ("small", "little"),
    ("tv", "television"), ("famous", "well known"), ("picture", "photo"), ("shop", "store"),
    ("explain", "describe"), ("quick", "fast"), ("job", "occupation"), ("happen", "occur"),
    ("happened", "occurred"), ("died", "passed away"), ("show", "series"), ("sings", "performs"),
)  # fmt: skip
_SYNONYM_OF = {a: b for a, b in _SYNONYMS} | {b: a for a, b in _SYNONYMS}
_REPHRASINGS = (
    (r"^what is (.+)$", r"tell me \1"), (r"^tell me (.+)$", r"what is \1"),
    (r"^what is\b", "what's"), (r"^what's\b", "what is"), (r"^who is\b", "who's"),
    (r"^who wrote (.+)$", r"who is the author of \1"),
    (r"^how many (.+)$", r"what is the number of \1"),
    (r"^who sings (.+)$", r"who is the singer of \1"), (r"^when did (.+)$", r"at what time did \1"),
    (r"^where is (.+)$", r"where can i find \1"), (r"^i want you to act as (.+)$", r"act as \1"),
    (r"^act as (.+)$", r"i want you to act as \1"), (r"^explain (.+)$", r"can you explain \1"),
)  # fmt: skip
_PREFIXES = ("please ", "can you tell me ", "could you tell me ", "i'd like to know ", "hey, ")
_SUFFIXES = (" please", " thanks", " thank you")


def surface(text: str, rng: random.Random) -> str:
    """Case, whitespace and sentence punctuation only."""
    words = text.rstrip("?.!").split()
    case = rng.choice((str.lower, str.upper, str.capitalize, str.title))
    joiner = rng.choice((" ", "  ", " \t"))
    end = rng.choice(("?", "", ".", " ?", "!"))
    out = joiner.join(case(w) for w in words) + end
    return rng.choice(("", " ", "\n")) + out if rng.random() < 0.3 else out


def typo(text: str, rng: random.Random) -> str:
    """One character inserted, deleted, swapped or replaced in one word of 4+ letters."""
    words = text.split()
    candidates = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha()]
    for i in rng.sample(candidates, len(candidates)):
        w, j = words[i], rng.randrange(1, len(words[i]) - 1)
        new = rng.choice((
            w[:j] + w[j + 1] + w[j] + w[j + 2 :],  # swap two neighbours
            w[:j] + w[j + 1 :],  # drop one
            w[:j] + w[j] + w[j:],  # double one
            w[:j] + rng.choice("aeioustnrl") + w[j + 1 :],  # replace one
        ))  # fmt: skip
        out = " ".join([*words[:i], new, *words[i + 1 :]])
        # the entity guards only: a typo changes a content word by definition, and the set
        # must not depend on the content guard it measures
        if new != w and guards_pass(text, out, content=False):
            return out
    return text


def filler(text: str, rng: random.Random) -> str:
    """Polite fillers added, dropped or moved between the front and the back."""
    lowered = text.lower()
    for prefix in _PREFIXES:
        if lowered.startswith(prefix):
            return text[len(prefix) :] + rng.choice(_SUFFIXES)  # move or drop
    for suffix in _SUFFIXES:
        if lowered.endswith(suffix):
            return rng.choice(_PREFIXES) + text[: -len(suffix)]
    if rng.random() < 0.5:
        return rng.choice(_PREFIXES) + text[0].lower() + text[1:]
    return text.rstrip("?.!") + rng.choice(_SUFFIXES)


def synonym(text: str, rng: random.Random) -> str:
    words = text.split()
    spots = [i for i, w in enumerate(words) if w.lower() in _SYNONYM_OF]
    if not spots:
        return text
    i = rng.choice(spots)
    words[i] = _SYNONYM_OF[words[i].lower()]
    return " ".join(words)


def rephrase(text: str, rng: random.Random) -> str:
    lowered = text.strip().lower()
    options = [(p, r) for p, r in _REPHRASINGS if re.search(p, lowered)]
    if not options:
        return text
    pattern, replacement = rng.choice(options)
    return re.sub(pattern, replacement, lowered)


PERTURBATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "surface": surface, "typo": typo, "filler": filler, "synonym": synonym, "rephrase": rephrase,
}  # fmt: skip


def positive(text: str, rng: random.Random) -> Pair | None:
    """A rewrite of `text` by one or two perturbations; None when none applied."""
    names = rng.sample(list(PERTURBATIONS), rng.choice((1, 1, 2)))
    out = text
    for name in names:
        out = PERTURBATIONS[name](out, rng)
    if out == text:
        return None
    return Pair(text, out, 1, "+".join(names))

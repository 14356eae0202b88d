"""Labelled prompt pairs for calibrating and testing semantic hits, built from the shipped prompts.

Three sets, all seeded:

- positives (label 1): one prompt and a meaning-preserving rewrite of it: whitespace / case /
  punctuation, a one-character typo in a word no guard reads (a typo in "1972" changes the
  question), polite fillers added, dropped or moved, synonyms from a small list, and rephrasings
  ("what is X" -> "tell me X").
- negatives (label 0): two different questions, mostly hard ones: NQ questions sharing two or
  more content words (and no answer), questions opening with the same words, one content word
  swapped for another question's, two "act as" role prompts; plus some random pairs.
- guard pairs (label 0): a prompt and a copy differing only in an amount, a date, an account or
  order number, a ticker, a percentage or a negation. Embeddings barely see these changes; they
  are what the entity guards (`guards.py`) are for and are kept out of calibration (they would
  make the threshold look safer than it is).

Sources: `nq_open_dev.jsonl` (questions with answers: two questions with a common answer are
never used as a negative) and the first sentence of `awesome_chatgpt_prompts.csv`'s text prompts.
Without them (tests, CI without shared/) a small built-in corpus stands in.
"""

from __future__ import annotations

import csv
import random
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from difflib import SequenceMatcher
from pathlib import Path

import orjson

from models.templates.guards import guards_pass

NQ_FILE = "nq_open_dev.jsonl"
ROLES_FILE = "awesome_chatgpt_prompts.csv"

FALLBACK_PROMPTS = (
    "when was the last time anyone was on the moon", "who wrote the declaration of independence",
    "how many seasons of the office are there", "what is the capital of australia",
    "who sings the song let it be", "where is the great barrier reef located",
    "when did the first world war begin", "what is the largest planet in the solar system",
    "who played the joker in the dark knight", "how many players are on a soccer team",
    "what is the boiling point of water at sea level", "who invented the telephone",
    "when was the eiffel tower built", "what language is spoken in brazil",
    "who is the author of pride and prejudice", "how long is the great wall of china",
    "what is the population of canada", "who won the world cup in 2014",
    "what does a central bank do", "how do interest rates affect inflation",
    "what is the difference between a stock and a bond", "how is a mortgage rate calculated",
    "why do bond prices fall when rates rise", "what is the tallest mountain in europe",
    "who directed the movie jaws", "when did the berlin wall fall",
    "I want you to act as a linux terminal.", "I want you to act as an English translator.",
    "I want you to act as a travel guide.", "I want you to act as a financial advisor.",
    "I want you to act as a math teacher.", "I want you to act as a storyteller.",
    "Explain how compound interest works for a savings account.",
    "Summarise the main risks of investing in emerging markets.",
    "Write a short poem about the ocean.", "Explain the rules of chess to a beginner.",
)  # fmt: skip

_STOP = {
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "is",
    "are", "was", "were", "be", "been", "who", "what", "when", "where", "which", "why", "how",
    "does", "do", "did", "has", "have", "had", "that", "this", "it", "its", "as", "into", "than",
    "then", "there", "their", "they", "he", "she", "his", "her", "i", "you", "your", "we", "our",
    "me", "my", "not", "no", "can", "will", "would", "should", "could", "about", "after", "before",
    "over", "under", "up", "down", "out", "many", "much", "most", "first", "last", "new", "one",
    "two", "song", "movie", "film", "play", "played", "name", "called", "want", "act",
}  # fmt: skip
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
_AUXILIARIES = re.compile(r"\b(is|are|was|were|does|do|did|can|will|should|has|have)\b", re.I)


@dataclass(frozen=True, slots=True)
class Pair:
    """Two prompts and whether one's answer serves the other (1) or not (0)."""

    text_a: str
    text_b: str
    label: int
    kind: str = ""


@dataclass(frozen=True, slots=True)
class Corpus:
    prompts: list[str]
    answers: dict[str, frozenset[str]]  # NQ question -> its answers (empty for other prompts)


def load_corpus(prompts_dir: Path | None) -> Corpus:
    """NQ questions and role-prompt first sentences from `prompts_dir`; the built-in corpus when
    the directory or its files are missing."""
    prompts: list[str] = []
    answers: dict[str, frozenset[str]] = {}
    nq = prompts_dir / NQ_FILE if prompts_dir else None
    if nq is not None and nq.is_file():
        for line in nq.read_text(encoding="utf-8").splitlines():
            row = orjson.loads(line)
            prompts.append(row["question"])
            answers[row["question"]] = frozenset(a.lower() for a in row.get("answer", []))
    roles = prompts_dir / ROLES_FILE if prompts_dir else None
    if roles is not None and roles.is_file():
        prompts += _role_sentences(roles)
    if not prompts:
        prompts = list(FALLBACK_PROMPTS)
    return Corpus(list(dict.fromkeys(prompts)), answers)


def _role_sentences(path: Path) -> list[str]:
    csv.field_size_limit(sys.maxsize)  # some prompts are 100k+ characters
    out = []
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("type", "TEXT") != "TEXT":
                continue
            first = re.split(r"(?<=[.!?])\s", " ".join(row["prompt"].split()), maxsplit=1)[0]
            if 20 <= len(first) <= 200 and first[0].isalpha():
                out.append(first)
    return out


# -- positives -----------------------------------------------------------------------------------


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


# -- negatives -----------------------------------------------------------------------------------


def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in _STOP)


class _NegativeSampler:
    """Different questions that look alike: shared content words, the same opening, or one
    entity-like word swapped."""

    def __init__(self, corpus: Corpus, rng: random.Random) -> None:
        self.corpus, self.rng = corpus, rng
        self.words = {p: _content(p) for p in corpus.prompts}
        self.by_word: dict[str, list[str]] = defaultdict(list)
        self.by_opening: dict[str, list[str]] = defaultdict(list)
        for p, words in self.words.items():
            for w in words:
                self.by_word[w].append(p)
            self.by_opening[_opening(p)].append(p)
        # A word in at most 3 prompts is more often a name ("antigone", "thames") than a verb or
        # a function word: swapping it changes what is asked rather than how.
        self.rare = {w for w, ps in self.by_word.items() if len(ps) <= 3 and len(w) > 3}
        self.roles = [p for p in corpus.prompts if p.lower().startswith("i want you to act as")]

    def _different(self, a: str, b: str) -> bool:
        if a == b or _content(a) == _content(b):
            return False
        answers_a, answers_b = self.corpus.answers.get(a), self.corpus.answers.get(b)
        return not (answers_a and answers_b and answers_a & answers_b)

    def _overlapping(self, a: str) -> str | None:
        """A prompt sharing at least two content words with `a`, rarer words first."""
        shared: Counter[str] = Counter()
        # ties broken by the word: a frozenset iterates in a per-process (hash seed) order
        for w in sorted(self.words[a], key=lambda w: (len(self.by_word[w]), w))[:6]:
            shared.update(p for p in self.by_word[w][:500] if p != a)
        pool = sorted(p for p, n in shared.items() if n >= 2)
        return self.rng.choice(pool) if pool else None

    def _swapped(self, a: str) -> str | None:
        words = a.split()
        spots = [i for i, w in enumerate(words) if w.lower() in self.rare]
        donor = self.rng.choice(self.by_opening[_opening(a)])
        donors = sorted(w for w in self.words[donor] if w in self.rare and w not in self.words[a])
        if len(words) > _SHORT or not spots or not donors:
            return None
        words[self.rng.choice(spots)] = self.rng.choice(donors)
        return " ".join(words)

    def sample(self, kind: str) -> Pair | None:
        rng, prompts = self.rng, self.corpus.prompts
        a = rng.choice(prompts)
        b: str | None = None
        if kind == "lexical":
            b = self._overlapping(a)
        elif kind == "opening":
            b = rng.choice(self.by_opening[_opening(a)])
        elif kind == "substitution":
            b = self._swapped(a)
        elif kind == "role" and len(self.roles) > 1:
            a, b = rng.sample(self.roles, 2)
        elif kind == "random":
            b = rng.choice(prompts)
        if b is None or not self._different(a, b):
            return None
        if kind != "substitution" and _near_copy(a, b):
            return None  # the file holds near-duplicates ("expert.create" / "expert create")
        return Pair(a, b, 0, kind)


_SHORT = 14  # words: in a longer prompt one swapped word is noise the embedding rightly ignores


def _near_copy(a: str, b: str) -> bool:
    return SequenceMatcher(None, a.lower(), b.lower()).ratio() > 0.9


def _opening(text: str) -> str:
    return " ".join(text.lower().split()[:2])


NEGATIVE_MIX = {"lexical": 0.35, "opening": 0.25, "substitution": 0.15, "role": 0.1, "random": 0.15}


def build_pairs(
    corpus: Corpus, n_pairs: int = 4000, positive_share: float = 0.4, seed: int = 0
) -> list[Pair]:
    """`n_pairs` labelled pairs, shuffled: positives by perturbation, negatives by `NEGATIVE_MIX`.
    Duplicates are dropped, so a small corpus may give fewer pairs."""
    rng = random.Random(seed)
    n_pos = round(n_pairs * positive_share)
    sampler = _NegativeSampler(corpus, rng)
    kinds, weights = list(NEGATIVE_MIX), list(NEGATIVE_MIX.values())
    pairs: dict[tuple[str, str], Pair] = {}
    for want, make in (
        (n_pos, lambda: positive(rng.choice(corpus.prompts), rng)),
        (n_pairs - n_pos, lambda: sampler.sample(rng.choices(kinds, weights)[0])),
    ):
        start, tries = len(pairs), 0
        while len(pairs) - start < want and tries < 50 * want:
            tries += 1
            pair = make()
            if pair is not None and (pair.text_a, pair.text_b) not in pairs:
                pairs[(pair.text_a, pair.text_b)] = pair
    out = list(pairs.values())
    rng.shuffle(out)
    return out


# -- guard pairs ---------------------------------------------------------------------------------

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


def write_pairs(pairs: Sequence[Pair], path: Path) -> None:
    """JSONL, one `{"text_a", "text_b", "label", "kind"}` per line."""
    Path(path).write_bytes(b"".join(orjson.dumps(asdict(p)) + b"\n" for p in pairs))


def read_pairs(path: Path) -> list[Pair]:
    """A JSON list or JSONL of `{"text_a", "text_b", "label"}` (label 0 or 1; extra fields kept
    only for `kind`). `ValueError` naming the record for anything else."""
    raw = Path(path).read_bytes()
    stripped = raw.lstrip()
    if stripped.startswith(b"["):
        records = orjson.loads(stripped)
    else:
        records = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
    pairs = []
    for i, r in enumerate(records):
        ok = isinstance(r, dict) and isinstance(r.get("text_a"), str)
        if not ok or not isinstance(r.get("text_b"), str) or r.get("label") not in (0, 1):
            raise ValueError(f"{path}: record {i + 1} needs text_a, text_b (strings), label 0|1")
        pairs.append(Pair(r["text_a"], r["text_b"], int(r["label"]), str(r.get("kind", ""))))
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs

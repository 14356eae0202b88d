"""The content-word guard: two prompts may share an answer only if they ask about the same things.

An embedding places "What is the daily ATM limit for gold cards?" and "... for silver cards?"
at cosine ~0.95, "USD to EUR" next to "EUR to USD", "higher" next to "lower", "buy" next to
"sell": closer than many true paraphrases, so no threshold separates them. The entity guards
(`guards.py`) read numbers, dates, money, identifiers, tickers and negations; this one reads
everything else that carries meaning, by lexical alignment over normalised words:

1. Question phrasings are rewritten to one form ("what is the number of" -> "how many", "at
   what time" -> "when", "could you tell me" -> "") and each word is lowercased, its plural and
   possessive dropped, and mapped through a small synonym list (`_SYNONYMS`).
2. Function words go (articles, pronouns, auxiliaries, prepositions, question words, polite
   fillers). What is left are the content words: entities, products, places, periods, actions,
   directions, comparatives. The two prompts must have the same set of them, except that a word
   of 5+ letters may match one letter off (an insertion, deletion, replacement or swap, the
   first letter kept): a typo, not another word ("sliver" for "silver"; "rates" and "dates"
   differ in their first letter and stay apart); and a leftover word may be a typo of a function
   word the other prompt has ("I wnat you to" / "I want you to"), or of a polite filler. The
   price of that allowance: "wall" beside another prompt's "will" reads as a typo of it.
3. Direction: around "to", "into", "from", "than", "vs" the nearest content words on each side
   form an ordered pair, and one prompt's (x, y) against the other's (y, x) vetoes ("convert
   USD to EUR" / "convert EUR to USD", "is gold better than silver" / "silver better than gold").
   Two content words that trade places while every other one stays where it was veto too
   ("send USD and have it arrive as GBP" / "send GBP ... as USD"): a paraphrase moves phrases,
   a swap of two roles keeps the sentence and exchanges its actors. And the question words, where
   both prompts have one, must agree ("when" / "where did the war begin"; "how many" and
   "what is the number of" are one after step 1).

Like the other guards it only ever vetoes: a false veto costs a model call, a missed one serves a
wrong answer. Its price is recall on paraphrases that change content words ("reset" / "change
my password"): `preheat bench semantic` measures both (the labelled pairs and the
entity-substitution set, `substitutions.py`).

Rejected alternatives: a cross-encoder or NLI verifier (a second model per hit, no local
weights shipped for it, and it still has to be calibrated on the same near-misses); spaCy NER
(misses "gold"/"silver" and "buy"/"sell", which are not named entities, and adds a model to the
serving path).
"""

from __future__ import annotations

import re

# Question phrasings that ask the same thing, rewritten to one form before the words are read
_PHRASES = (
    (r"\bwhat is the number of\b", "how many"), (r"\bwhat's the number of\b", "how many"),
    (r"\bat what time\b", "when"), (r"\bwhere can i find\b", "where is"),
    (r"\bwho is the author of\b", "who wrote"), (r"\bwho is the singer of\b", "who sings"),
    (r"\b(?:can|could|would) you (?:please )?(?:tell me|explain|let me know)\b", "explain"),
    (r"\bi'd like to know\b", ""), (r"\bi would like to know\b", ""), (r"\btell me\b", ""),
    (r"\bi want you to\b", ""), (r"\bthank you\b", ""), (r"\bwell known\b", "famous"),
    (r"\bpassed away\b", "died"), (r"\bcash machine\b", "atm"),
    (r"\b([a-z]{3})/([a-z]{3})\b", r"\1 to \2"),  # "usd/eur": a direction
)  # fmt: skip
_PHRASE_RES = [(re.compile(p), r) for p, r in _PHRASES]
_WORD = re.compile(r"[a-z]+")
_WITH_DIGIT = re.compile(r"[\w-]*\d[\w-]*")
_FUNCTION_TEXT = (
    "a an the of in on at to for from by with and or but if so as into onto than then there here"
    " is are was were be been being am do does did doing done has have had having can could will"
    " would shall should may might must what whats which who whom whose when where why how many"
    " much i me my mine we us our ours you your yours he him his she her hers it its they them"
    " their theirs this that these those some any each every all both either neither also too"
    " very just really please thanks thank hey hi hello kindly exactly actually tell know like"
    " want wonder get got not no never none nor without s t d ll re ve m vs versus against about"
    " explain"
)
_FUNCTION_WORDS = frozenset(_FUNCTION_TEXT.split())
# what a question asks for: "when" and "where did the war begin" are different questions
_QUESTION_WORDS = {"who": "who", "whom": "who", "whose": "whose", "what": "what",
                   "whats": "what", "which": "what", "when": "when", "where": "where",
                   "why": "why", "how": "how"}  # fmt: skip
# (word, its canonical form): paraphrases seen in questions, general and banking
_SYNONYMS = {
    "film": "movie", "biggest": "largest", "start": "begin", "started": "begin",
    "began": "begin", "purchase": "buy", "make": "create", "made": "create",
    "created": "create", "writer": "author", "wrote": "author", "written": "author",
    "nation": "country", "automobile": "car", "physician": "doctor", "child": "kid",
    "children": "kid", "assist": "help", "repair": "fix", "large": "big", "little": "small",
    "television": "tv", "photo": "picture", "store": "shop", "describe": "explain",
    "fast": "quick", "occupation": "job", "occur": "happen", "occurred": "happen",
    "happened": "happen", "series": "show", "performs": "sing", "sings": "sing",
    "singer": "sing", "perform": "sing",
}  # fmt: skip
_CONNECTORS = frozenset({"to", "into", "from", "than", "vs", "versus", "against"})
_REACH = 3  # words either side of a connector searched for its content word
_TYPO_MIN_LETTERS = 5


def _canonical(word: str) -> str:
    word = word.removesuffix("'s")
    if word in _SYNONYMS:
        return _SYNONYMS[word]
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    return _SYNONYMS.get(word, word)


def _words(text: str) -> list[str]:
    lowered = text.lower().replace("\u2019", "'").replace("n't", "nt")
    for pattern, replacement in _PHRASE_RES:
        lowered = pattern.sub(replacement, lowered)
    # a token with a digit in it ("1st", "5k", "ACC-1234", "Q3") is the number, date and
    # identifier guards' to read
    lowered = _WITH_DIGIT.sub(" ", lowered)
    return _WORD.findall(lowered.replace("'s", ""))


def _content(word: str) -> str | None:
    """The canonical content word, or None for a function word (before or after mapping)."""
    if word in _FUNCTION_WORDS:
        return None
    canonical = _canonical(word)
    return None if canonical in _FUNCTION_WORDS else canonical


def _typo_of(word: str, function_word: str) -> bool:
    """`word` is `function_word` one letter off (first letter kept)."""
    if word[0] != function_word[0] or abs(len(word) - len(function_word)) > 1:
        return False
    return _edits_of_one(word, function_word)


def _content_sequence(text: str) -> list[str]:
    return [c for w in _words(text) if (c := _content(w)) is not None]


def content_words(text: str) -> frozenset[str]:
    """The prompt's content words, normalised (module docstring, steps 1-2)."""
    return frozenset(_content_sequence(text))


def _swapped(a: list[str], b: list[str]) -> bool:
    """`b` is `a` with exactly two different words exchanged."""
    if len(a) != len(b):
        return False
    diffs = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return len(diffs) == 2 and a[diffs[0]] == b[diffs[1]] and a[diffs[1]] == b[diffs[0]]


def question_words(text: str) -> frozenset[str]:
    """What the question asks for ("what" and "which" alike), after the phrase rewrites."""
    return frozenset(_QUESTION_WORDS[w] for w in _words(text) if w in _QUESTION_WORDS)


def directions(text: str) -> set[tuple[str, str]]:
    """(content word before, content word after) around each connector (step 3)."""
    words = _words(text)
    found = set()
    for i, word in enumerate(words):
        if word not in _CONNECTORS:
            continue
        left = [c for w in words[max(0, i - _REACH) : i] if (c := _content(w)) is not None]
        right = [c for w in words[i + 1 : i + 1 + _REACH] if (c := _content(w)) is not None]
        if left and right:
            found.add((left[-1], right[0]))
    return found


def _one_letter_off(a: str, b: str) -> bool:
    """A typo of one another: one insertion, deletion, replacement or neighbour swap, the first
    letter kept, the longer word 5+ letters long and the shorter 4+."""
    if max(len(a), len(b)) < _TYPO_MIN_LETTERS or min(len(a), len(b)) < 4:
        return False
    if a[0] != b[0] or abs(len(a) - len(b)) > 1:
        return False
    return _edits_of_one(a, b)


def _edits_of_one(a: str, b: str) -> bool:
    """One insertion, deletion, replacement or neighbour swap apart."""
    if len(a) == len(b):
        diffs = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diffs) == 1 or (
            len(diffs) == 2 and diffs[1] == diffs[0] + 1 and a[diffs[0]] == b[diffs[1]]
            and a[diffs[1]] == b[diffs[0]]
        )  # fmt: skip
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


_FILLERS = ("please", "thanks", "thank", "hello", "kindly")  # may be mistyped on one side only


def _typos_of_function_words(leftover: list[str], other: str) -> bool:
    """Whether every word in `leftover` is a typo of a 4+ letter function word that `other`
    has (as written, before the phrase rewrites), or of a polite filler."""
    written = set(_WORD.findall(other.lower()))
    candidates = [w for w in written if w in _FUNCTION_WORDS and len(w) >= 4] + list(_FILLERS)
    return all(any(_typo_of(word, f) for f in candidates) for word in leftover)


def content_words_agree(a: str, b: str, read_elsewhere: frozenset[str] = frozenset()) -> bool:
    """True when `a` and `b` name the same content words in the same directions.

    `read_elsewhere`: words another guard reads in its own canonical form (number and currency
    words, months, negations: "two" == "2", "100 dollars" == "$100"), left out of the sets."""
    words_a = {w for w in content_words(a) if w not in read_elsewhere}
    words_b = {w for w in content_words(b) if w not in read_elsewhere}
    only_a, only_b = sorted(words_a - words_b), sorted(words_b - words_a)
    for word in list(only_a):  # a word left over must be a typo of one left on the other side
        match = next((other for other in only_b if _one_letter_off(word, other)), None)
        if match is not None:
            only_a.remove(word)
            only_b.remove(match)
    # ... or of a function word the other prompt has there ("I wnat you to" / "I want you to"):
    # pairwise only, so "wall" is not taken for "will" unless the other prompt says "will"
    if not _typos_of_function_words(only_a, b) or not _typos_of_function_words(only_b, a):
        return False
    asks_a, asks_b = question_words(a), question_words(b)
    if asks_a and asks_b and asks_a != asks_b:  # (a request without one, "tell me X", passes)
        return False
    forward = directions(a)
    if any((y, x) in forward for x, y in directions(b) if x != y):
        return False
    return not _swapped(_content_sequence(a), _content_sequence(b))

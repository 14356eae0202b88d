"""Hard negative pairs: two different questions that look alike (label 0).

`NegativeSampler` draws them by kind (`NEGATIVE_MIX`): questions sharing two or more content
words, questions with the same opening, one rare word swapped for another question's, two role
prompts, and random pairs; never two questions with a common answer, nor near-copies.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from difflib import SequenceMatcher

from models.templates.pair_corpus import Corpus, Pair

_STOP = {
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "is",
    "are", "was", "were", "be", "been", "who", "what", "when", "where", "which", "why", "how",
    "does", "do", "did", "has", "have", "had", "that", "this", "it", "its", "as", "into", "than",
    "then", "there", "their", "they", "he", "she", "his", "her", "i", "you", "your", "we", "our",
    "me", "my", "not", "no", "can", "will", "would", "should", "could", "about", "after", "before",
    "over", "under", "up", "down", "out", "many", "much", "most", "first", "last", "new", "one",
    "two", "song", "movie", "film", "play", "played", "name", "called", "want", "act",
}  # fmt: skip


def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in _STOP)


class NegativeSampler:
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

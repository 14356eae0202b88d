"""Word-level tokens of a prompt, as template mining and `assign` both see them.

A prompt is split into words and single punctuation marks, lower-cased, so whitespace and case do
not split a template ("Summarise:" and "summarise :" are the same constant). Each token keeps its
character span in the original text, so a template's constant text is shown as users wrote it.

Very long prompts are cut: the first `HEAD_TOKENS` and the last `TAIL_TOKENS` tokens are kept with
a `GAP` token between them, which no constant ever contains, so whatever was cut lies in a slot.
Constants are instructions and system prompts at the start or the end of a prompt; a constant in
the middle of a 100k-character prompt is not found (rejected alternative: tokenise all of it —
one 144k-character prompt in the shipped role prompts took longer than a thousand short ones).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import islice

HEAD_TOKENS = 256
TAIL_TOKENS = 64
HEAD_CHARS = 4_000
TAIL_CHARS = 1_000
GAP = "\x00gap"  # never produced by the tokenizer: the regex matches no NUL character

_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_")
_WORD = re.compile(r"\w")


@dataclass(frozen=True, slots=True)
class Tokens:
    """A prompt's normalised tokens and each token's (start, end) span in the original text."""

    text: str
    words: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.words)


def _scan(text: str, start: int, end: int, limit: int | None = None) -> list[tuple[str, int, int]]:
    matches = (m for m in _TOKEN.finditer(text, start, end) if "\x00" not in m.group())
    return [(m.group().lower(), m.start(), m.end()) for m in islice(matches, limit)]


def tokenize(text: str) -> Tokens:
    """Normalised tokens of `text`, cut to head + GAP + tail when long (see module docstring).

    Only the head and the tail are scanned: a 144k-character prompt costs what a 5k one does.
    """
    if not isinstance(text, str):
        raise TypeError(f"a prompt must be a str, not {type(text).__name__}")
    keep = HEAD_TOKENS + TAIL_TOKENS
    head_end = min(len(text), HEAD_CHARS)
    found = _scan(text, 0, head_end, keep + 1)
    if len(found) > keep or head_end < len(text):
        if len(found) <= keep:  # stopped at HEAD_CHARS: the last token may be half a word
            found = found[:-1]
        head = found[:HEAD_TOKENS]
        gap_at = head[-1][2] if head else 0
        tail_start = max(gap_at, len(text) - TAIL_CHARS)
        tail = _scan(text, tail_start, len(text))
        if tail_start > gap_at:  # the first tail token may be half a word
            tail = tail[1:]
        found = [*head, (GAP, gap_at, gap_at), *tail[-TAIL_TOKENS:]]
    words = tuple(word for word, _, _ in found)
    spans = tuple((start, end) for _, start, end in found)
    return Tokens(text, words, spans)


def is_word(token: str) -> bool:
    return token != GAP and _WORD.search(token) is not None


def word_count(tokens: tuple[str, ...]) -> int:
    """Tokens that are words (not punctuation, not the gap): how much a constant says."""
    return sum(1 for token in tokens if is_word(token))

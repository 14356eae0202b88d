"""Entity guards: two prompts may share a cached answer only if their guarded entities are equal.

An embedding sees "send 100 dollars" and "send 1000 dollars" as near-identical (cosine ~0.97 with
MiniLM), and "do" / "do not" barely move it; a cosine threshold alone (what GPTCache does) will
serve one answer for the other. Each guard extracts a multiset of canonical entities from a prompt
and a semantic hit needs them equal, category by category:

- number: digits with thousands separators and decimals as a value ("1,000.50" == "1000.5"),
  number words ("two" == "2"), ordinals ("1st" == "first"), multipliers ("5k", "million").
- date: month names (May only next to a number: it is also a verb), weekdays, relative days
  ("tomorrow"), quarters ("Q3"), ISO and slashed dates as one entity.
- money: currency symbols, codes and words as an ISO code, with the amount next to it
  ("$100" == "100 dollars" == "USD 100").
- percent: %, percent, per cent, pct, basis points, percentage points, with their value.
- identifier: account / order / invoice numbers: letter-digit mixes ("ACC-1234"), "#123", and runs
  of 5+ digits; compared without case and separators ("1234-5678" == "12345678").
- ticker: cashtags ("$AAPL") and all-capitals words of 2-5 letters ("MSFT", "BRK.B"). Compared
  symmetrically and without case: every capitals word found in either prompt must occur equally
  often in both, so "AAPL" vs "aapl" passes (a case change) while "AAPL" vs "MSFT" fails. A
  prompt in capitals throughout offers only its cashtags. Tickers in the same case in both
  prompts ("aapl" vs "msft", or both shouted) are not seen: that needs a symbol list.
- negation: not, no, never, none, nor, cannot, without, n't and its apostrophe-less forms
  ("dont"), counted.

The guards are deliberately one-sided: they only ever veto a hit. A false veto costs a cache miss
(the model answers); a missed veto can serve a wrong answer. So ambiguities resolve towards
"different" ("two hundred" is the entities {2, 100}, not 200, and does not equal "200"), and
a changed entity, product, place, period, action, direction or comparative ("gold"/"silver
cards", "USD to EUR"/"EUR to USD", "buy"/"sell") is the content-word guard's
(`content_guard.py`), category "content".

Rejected alternative: one "all digits equal" rule. It misses currencies, months, tickers and
negations, and cannot tell "$100" and "100 dollars" apart from "100 euros".
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from models.templates.content_guard import content_words_agree

CATEGORIES = (
    "number", "date", "money", "percent", "identifier", "ticker", "negation", "content",
)  # fmt: skip

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201b": "'", "\u02bc": "'", "`": "'"})

# A number: 1,234,567.89 or 1234.5 or 42; not part of a longer digit run.
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_NUMBER_RE = re.compile(rf"(?<![\d.,])(?:{_NUMBER})(?!\d)")
_MULTIPLIER_SUFFIX = re.compile(r"(?<=\d)\s?(k|m|mm|bn|b|tn)\b", re.I)
_UNITS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
)  # fmt: skip
_TENS = ("thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
)  # fmt: skip
_NUMBER_WORDS = (
    {w: str(i) for i, w in enumerate(_UNITS)}
    | {w: str(10 * (i + 3)) for i, w in enumerate(_TENS)}
    | {w: str(i + 1) for i, w in enumerate(_ORDINALS)}
)
_MULTIPLIERS = {
    "hundred": "e2", "thousand": "e3", "k": "e3", "million": "e6", "m": "e6", "mm": "e6",
    "billion": "e9", "bn": "e9", "b": "e9", "trillion": "e12", "tn": "e12", "dozen": "x12",
    "half": "x0.5", "quarter": "x0.25", "twice": "x2", "double": "x2", "triple": "x3",
}  # fmt: skip
_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")

_MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
)  # fmt: skip
_MONTH_OF = (
    {m: i + 1 for i, m in enumerate(_MONTHS)}
    | {m[:3]: i + 1 for i, m in enumerate(_MONTHS) if m != "may"}
    | {"sept": 9}
)
_MAY_WITH_NUMBER = re.compile(r"\bmay\s+\d|\d(?:st|nd|rd|th)?\s+(?:of\s+)?may\b")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_RELATIVE = {"today", "tomorrow", "yesterday", "tonight", "weekend", "overnight", "ytd", "mtd"}
_RELATIVE_SPAN = re.compile(r"\b(next|last|this|previous|coming)\s+(day|week|month|quarter|year)")
_QUARTER = re.compile(r"\b(q[1-4]|h[12]|fy\s?\d{2,4})\b")
_ISO_DATE = re.compile(r"\b(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})\b")
_SLASH_DATE = re.compile(r"\b(\d{1,2})[/.](\d{1,2})[/.](\d{2,4})\b")

_CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "₿": "BTC"}
_CURRENCY_WORDS = {
    "usd": "USD", "dollar": "USD", "dollars": "USD", "bucks": "USD", "cent": "USD/100",
    "cents": "USD/100", "eur": "EUR", "euro": "EUR", "euros": "EUR", "gbp": "GBP", "pound": "GBP",
    "pounds": "GBP", "sterling": "GBP", "jpy": "JPY", "yen": "JPY", "inr": "INR", "rupee": "INR",
    "rupees": "INR", "chf": "CHF", "franc": "CHF", "francs": "CHF", "cad": "CAD", "aud": "AUD",
    "cny": "CNY", "yuan": "CNY", "rmb": "CNY", "btc": "BTC", "bitcoin": "BTC", "eth": "ETH",
}  # fmt: skip
_AMOUNT = rf"(?:{_NUMBER})(?:\s?(?:k|m|mm|bn|b|million|billion|thousand))?"
_SYMBOL_AMOUNT = re.compile(rf"([$€£¥₹₿])\s?({_AMOUNT})", re.I)
_CODE = "|".join(sorted(_CURRENCY_WORDS, key=len, reverse=True))
_AMOUNT_CODE = re.compile(rf"({_AMOUNT})\s?({_CODE})\b", re.I)
_CODE_AMOUNT = re.compile(rf"\b({_CODE})\s?({_AMOUNT})", re.I)
_CURRENCY_ANY = re.compile(rf"[$€£¥₹₿]|\b(?:{_CODE})\b", re.I)

_PERCENT_UNITS = {"pp": "pp", "bps": "bp", "basis point": "bp", "basis points": "bp"}
_PERCENT = re.compile(
    rf"({_NUMBER})?\s?(?:(%)|(percent(?:age points?)?|per\s?cent|pct|pp|bps|basis points?)\b)",
    re.I,
)

_ID_CUES = (
    "account|acct|order|invoice|ticket|ref|reference|id|number|no|card|iban|policy|claim|case|"
    "tracking|transaction|customer|client|member|contract|loan"
)
_IDENTIFIERS = (
    re.compile(r"#\s*(\d[\d-]*)"),  # "#12345"
    re.compile(rf"\b(?:{_ID_CUES})\.?\s*(\d[\d-]*)", re.I),  # "order 12345", "no. 1234-5678"
    re.compile(r"\b((?=[\w-]*\d)(?=[\w-]*[a-z])[a-z0-9]+(?:[-_/][a-z0-9]+)*)\b", re.I),  # ACC-1
)
_ORDINAL_OR_UNIT = re.compile(r"^\d+(?:st|nd|rd|th|s|k|m|mm|bn|b|tn|am|pm|d|h)$", re.I)

_CASHTAG = re.compile(r"\$([A-Za-z]{1,5}(?:\.[A-Za-z])?)\b")
_CAPS_WORD = re.compile(r"\b[A-Z]{2,5}(?:\.[A-Z])?\b")

_NEGATIONS = {
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "nowhere", "cannot",
    "without", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "cant", "couldnt",
    "wouldnt", "shouldnt", "hasnt", "havent", "hadnt", "aint", "mustnt", "neednt", "wont",
}  # fmt: skip
# the words these guards read in their own canonical forms: not the content guard's to compare
_READ_HERE = frozenset(
    {*_NUMBER_WORDS, *_MULTIPLIERS, *_CURRENCY_WORDS, *_MONTHS, *_MONTH_OF, *_WEEKDAYS,
     *_RELATIVE, *_NEGATIONS, "percent", "percentage", "per", "cent", "pct", "pp", "bps",
     "basis", "point", "dollar", "euro", "pound", "rupee", "franc"}
)  # fmt: skip
_NOT_NEGATION = re.compile(r"\bno\.?\s*(?=\d|#)", re.I)  # "no. 5", "account no 1234"


def _prepare(text: str) -> str:
    """NFKC, straight quotes, single spaces: what every extractor reads."""
    return " ".join(unicodedata.normalize("NFKC", text).translate(_QUOTES).split())


def _value(number: str) -> str:
    """Canonical numeral: no thousands separators, no trailing zeros ("1,000.50" -> "1000.5")."""
    try:
        value = Decimal(number.replace(",", "")).normalize()
    except InvalidOperation:
        return number
    return format(value, "f")


def numbers(text: str) -> Counter[str]:
    lowered = _prepare(text).lower()
    found = Counter(_value(m.group()) for m in _NUMBER_RE.finditer(lowered))
    found.update(_MULTIPLIERS[m.group(1).lower()] for m in _MULTIPLIER_SUFFIX.finditer(lowered))
    for word in _WORD_RE.findall(lowered):
        if word in _NUMBER_WORDS:
            found[_NUMBER_WORDS[word]] += 1
        elif word in _MULTIPLIERS and len(word) > 2:  # the words, not the k/m/bn suffixes
            found[_MULTIPLIERS[word]] += 1
    return found


def dates(text: str) -> Counter[str]:
    lowered = _prepare(text).lower()
    found: Counter[str] = Counter()
    for word in _WORD_RE.findall(lowered):
        if word in _MONTH_OF and word != "may":
            found[f"month{_MONTH_OF[word]}"] += 1
        elif word in _WEEKDAYS:
            found[f"weekday{_WEEKDAYS.index(word) + 1}"] += 1
        elif word in _RELATIVE:
            found[word] += 1
    found["month5"] += len(_MAY_WITH_NUMBER.findall(lowered))
    found.update(f"{a}-{b}" for a, b in _RELATIVE_SPAN.findall(lowered))
    found.update(q.replace(" ", "") for q in _QUARTER.findall(lowered))
    found.update(f"{int(y)}-{int(m)}-{int(d)}" for y, m, d in _ISO_DATE.findall(lowered))
    found.update(f"{int(a)}/{int(b)}/{int(c)}" for a, b, c in _SLASH_DATE.findall(lowered))
    return +found


def _amount(text: str) -> str:
    number = _NUMBER_RE.search(text)
    suffix = text[number.end() :].strip().lower() if number else ""
    return _value(number.group()) + (_MULTIPLIERS.get(suffix, "") if number else "")


def money(text: str) -> Counter[str]:
    prepared = _prepare(text)
    found: Counter[str] = Counter()
    for symbol, amount in _SYMBOL_AMOUNT.findall(prepared):
        found[f"{_CURRENCY_SYMBOLS[symbol]}:{_amount(amount)}"] += 1
    for amount, code in _AMOUNT_CODE.findall(prepared):
        found[f"{_CURRENCY_WORDS[code.lower()]}:{_amount(amount)}"] += 1
    for code, amount in _CODE_AMOUNT.findall(prepared):
        found[f"{_CURRENCY_WORDS[code.lower()]}:{_amount(amount)}"] += 1
    for mention in _CURRENCY_ANY.findall(prepared):  # every currency named, amount or not
        found[_CURRENCY_SYMBOLS.get(mention) or _CURRENCY_WORDS[mention.lower()]] += 1
    return found


def percents(text: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for m in _PERCENT.finditer(_prepare(text)):
        word = re.sub(r"\s+", " ", (m.group(3) or "%").lower())
        unit = _PERCENT_UNITS.get(word, "pp" if "point" in word else "%")
        found[f"{_value(m.group(1)) if m.group(1) else ''}{unit}"] += 1
    return found


def identifiers(text: str) -> Counter[str]:
    prepared = _prepare(text)
    found: Counter[str] = Counter()
    for pattern in _IDENTIFIERS:
        for token in pattern.findall(prepared):
            if _ORDINAL_OR_UNIT.match(token):  # "21st", "5k", "10pm" belong to other guards
                continue
            found[re.sub(r"[\s_/-]", "", token).lower()] += 1
    return found


def _shouted(text: str) -> bool:
    """Mostly capitals: then a capitals word is no sign of a ticker."""
    words = re.findall(r"[A-Za-z]{2,}", text)
    return len(words) >= 3 and sum(w.isupper() for w in words) >= 0.6 * len(words)


def _ticker_candidates(text: str) -> set[str]:
    prepared = _prepare(text)
    found = {m.group(1).upper() for m in _CASHTAG.finditer(prepared)}
    if not _shouted(prepared):
        found |= set(_CAPS_WORD.findall(prepared))
    return {c for c in found if c.lower() not in _CURRENCY_WORDS}  # "USD 100": the money guard's


def _word_counts(text: str, words: set[str]) -> Counter[str]:
    tokens = re.findall(r"[a-z]+(?:\.[a-z])?", _prepare(text).lower())
    return Counter(t for t in tokens if t in words)


def negations(text: str) -> Counter[str]:
    lowered = _NOT_NEGATION.sub(" ", _prepare(text).lower())
    count = sum(1 for w in _WORD_RE.findall(lowered) if w in _NEGATIONS or w.endswith("n't"))
    return Counter({"not": count}) if count else Counter()


EXTRACTORS: dict[str, Callable[[str], Counter[str]]] = {
    "number": numbers,
    "date": dates,
    "money": money,
    "percent": percents,
    "identifier": identifiers,
    "negation": negations,
}


def guard_violations(a: str, b: str, content: bool = True) -> list[str]:
    """The guard categories whose entities differ between `a` and `b` (empty: they may share an
    answer). Tickers are compared symmetrically (see the module docstring). `content=False`
    leaves the content-word guard out (calibration: see `SemanticCache.decision_score`)."""
    failed = [name for name, extract in EXTRACTORS.items() if extract(a) != extract(b)]
    candidates = {c.lower() for c in _ticker_candidates(a) | _ticker_candidates(b)}
    if candidates and _word_counts(a, candidates) != _word_counts(b, candidates):
        failed.insert(CATEGORIES.index("ticker"), "ticker")
    if content and not content_words_agree(a, b, _READ_HERE):
        failed.append("content")
    return failed


def guards_pass(a: str, b: str, content: bool = True) -> bool:
    """True when no guard tells `a` and `b` apart."""
    return not guard_violations(a, b, content)

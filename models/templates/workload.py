"""A seeded, labelled templated workload built from real prompts, for developing template mining.

Enterprise traffic is mostly instruction templates whose slots carry user content. This builds
that shape from real texts: instruction templates (finance and support instructions with one to
three slots, one slot first) and role templates ("I want you to act as a <act>. <*>", one per
role of the awesome-chatgpt-prompts file), whose slots are filled with real NQ questions and real
role prompts; plus one-off prompts (label -1) drawn from the same files and used nowhere else.
Template volumes are Zipf-distributed, as template popularity is in the synthetic log.

The shipped files are read by path (`../shared/data/prompts`); without them (tests, CI) a small
built-in corpus stands in. The project is measured on a workload it has not seen, so nothing in
the miner may depend on these particular instructions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SLOT = "<*>"
INSTRUCTIONS: tuple[str, ...] = (
    "Summarise this filing for a credit analyst: <*>",
    "Explain this code and list its risks: <*>",
    "Classify this card transaction as fraud or not: <*>",
    "Draft a reply to this customer complaint: <*>",
    "Extract the counterparties and amounts from this contract: <*>",
    "Translate this term sheet into plain English: <*>",
    "List the covenants in this loan agreement: <*>",
    "Answer the client's question about this fund: <*>",
    "You are a compliance assistant at a retail bank. Check this message for regulatory "
    "issues and cite the rule you rely on.\n\nMessage: <*>",
    "Rewrite the following request in formal business English: <*>",
    "Give three follow-up questions an auditor would ask about this: <*>",
    "<*>\n\nTranslate the text above into French.",
    "<*>\n\nAnswer in one sentence, then list the sources you would check.",
    "Compare these two client questions and say which is more urgent. First: <*> Second: <*>",
    "Context: <*>\nQuestion: <*>\nAnswer using only the context above.",
    "Customer message: <*>\nAccount note: <*>\nAgent draft: <*>\n"
    "Check the agent draft for tone and accuracy.",
)
ROLE = "I want you to act as {article} {act}. <*>"
MIN_POOL = 50

_BUILTIN_QUESTIONS = (
    "how long does it take to boil an egg", "who wrote the declaration of independence",
    "what is the capital of australia", "when did the berlin wall fall",
    "why is the sky blue during the day", "how many moons does jupiter have",
    "where is the headquarters of the world bank", "what does a central bank do",
    "who painted the ceiling of the sistine chapel", "how do interest rates affect bond prices",
    "what is the tallest mountain in africa", "when was the first credit card issued",
    "how does compound interest work", "which planet has the longest day",
    "who invented the telephone", "what causes inflation to rise",
    "how deep is the mariana trench", "when did the euro become a currency",
    "what is a mortgage backed security", "who was the first woman in space",
    "how many bones are in the human body", "what is the speed of sound in water",
    "where do monarch butterflies spend the winter", "how does a lease differ from a loan",
    "who founded the red cross", "how is a credit score calculated",
    "when was the printing press invented", "what is the largest desert in the world",
    "how do vaccines train the immune system", "who composed the four seasons",
    "what is an index fund", "how long is the great wall of china",
    "when did humans first land on the moon", "what language is spoken in brazil",
    "how are hurricanes named", "who discovered penicillin",
    "what is a stock split", "how many players are on a rugby team",
    "where is the oldest university in europe", "what is the boiling point of ethanol",
    "how do solar panels generate electricity", "who wrote pride and prejudice",
    "what is a letter of credit", "when did the great depression start",
    "how many time zones does russia have", "what is the function of the liver",
    "who built the first mechanical computer", "what is quantitative easing",
    "how fast does light travel", "where was the first olympic games held",
)  # fmt: skip
_BUILTIN_ROLES = (
    ("Travel Guide", "Suggest places to visit near my location and explain why each is worth it."),
    ("Math Tutor", "Explain each step of the solution so a student can follow the reasoning."),
    ("Career Coach", "Ask me about my experience and suggest the next role I should aim for."),
    ("Poet", "Write short poems about the subjects I give you, with vivid imagery."),
    ("Linux Terminal", "Reply only with the terminal output inside one code block."),
    ("Financial Advisor", "Review my budget and suggest where I could save every month."),
    ("Chef", "Suggest recipes from the ingredients I list and keep them simple."),
    ("Historian", "Explain the causes and consequences of the events I mention."),
    ("Debate Coach", "Prepare arguments for both sides of the motion I give you."),
    ("Fitness Trainer", "Design a weekly plan for the goals and limits I describe."),
    ("Storyteller", "Tell engaging stories for the audience I describe."),
    ("Legal Advisor", "Explain my options in plain language for the situation I describe."),
)  # fmt: skip


@dataclass(frozen=True)
class PromptCorpus:
    """Real texts to fill slots and to serve as one-offs."""

    questions: tuple[str, ...]
    roles: tuple[tuple[str, str], ...]  # (act, prompt)
    source: str


@dataclass(frozen=True)
class TemplatedWorkload:
    """Prompts with their ground-truth template (index into `templates`; -1 for a one-off)."""

    prompts: list[str]
    labels: list[int]
    templates: list[str]


def default_prompts_dir() -> Path:
    return Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "prompts"


def builtin_corpus(extra: int = 1_500) -> PromptCorpus:
    """The stand-in corpus: the built-in questions plus `extra` seeded word sequences drawn from
    their vocabulary, so that fillers rarely repeat (a repeated filler repeats a whole prompt,
    and repeats are one distinct prompt to the miner)."""
    rng = np.random.default_rng(0)
    texts = [*_BUILTIN_QUESTIONS, *(p for _, p in _BUILTIN_ROLES)]
    vocab = sorted({w.strip(".,").lower() for text in texts for w in text.split()})
    salad = tuple(" ".join(rng.choice(vocab, size=int(rng.integers(6, 15)))) for _ in range(extra))
    return PromptCorpus(_BUILTIN_QUESTIONS + salad, _BUILTIN_ROLES, "builtin")


def load_corpus(prompts_dir: Path | None = None) -> PromptCorpus:
    """The shipped NQ questions and role prompts, or the built-in corpus when they are absent."""
    folder = Path(prompts_dir) if prompts_dir is not None else default_prompts_dir()
    nq, roles = folder / "nq_open_dev.jsonl", folder / "awesome_chatgpt_prompts.csv"
    if not (nq.is_file() and roles.is_file()):
        return builtin_corpus()
    import pandas as pd

    with open(nq, encoding="utf-8") as source:
        questions = tuple(json.loads(line)["question"] for line in source if line.strip())
    frame = pd.read_csv(roles, usecols=["act", "prompt"]).dropna()
    pairs = tuple(zip(frame["act"].astype(str), frame["prompt"].astype(str), strict=True))
    return PromptCorpus(questions, pairs, "shipped")


def _clip(text: str, limit: int = 400) -> str:
    """A role prompt cut at a sentence end near `limit` characters (slot fillers stay short)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    return text[: cut + 1] if cut > limit // 3 else text[:limit]


class _Pool:
    """Texts drawn without replacement (reshuffled when exhausted)."""

    def __init__(self, texts: list[str], rng: np.random.Generator) -> None:
        self.texts, self.rng, self.order, self.at = texts, rng, np.array([], dtype=int), 0

    def draw(self) -> str:
        if self.at >= len(self.order):
            self.order, self.at = self.rng.permutation(len(self.texts)), 0
        self.at += 1
        return self.texts[int(self.order[self.at - 1])]


def _roles(corpus: PromptCorpus, rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    short = [(a, p) for a, p in corpus.roles if 1 <= len(a.split()) <= 4 and "act" not in a.lower()]
    unique = list({a.lower(): (a, p) for a, p in short}.values())
    picked = rng.choice(len(unique), size=min(n, len(unique)), replace=False)
    return [unique[int(i)] for i in picked]


def templated_workload(
    corpus: PromptCorpus,
    n_prompts: int = 3_000,
    n_roles: int = 24,
    one_off_share: float = 0.2,
    zipf_s: float = 0.8,
    seed: int = 0,
) -> TemplatedWorkload:
    """Generate the workload (see the module docstring); deterministic for a seed.

    One-offs are half questions, half role prompts, and never also slot fillers; a small corpus
    (the built-in one) gives fewer one-offs than asked rather than repeating them.
    """
    if not 0.0 <= one_off_share < 1.0:
        raise ValueError("one_off_share must be in [0, 1)")
    rng = np.random.default_rng(seed)
    roles = _roles(corpus, rng, n_roles)
    templates = list(INSTRUCTIONS) + [
        ROLE.format(article="an" if act[0].lower() in "aeiou" else "a", act=act) for act, _ in roles
    ]
    used = {act for act, _ in roles}
    questions = [str(q) for q in rng.permutation(np.array(corpus.questions, dtype=object))]
    role_texts = [_clip(p) for a, p in corpus.roles if a not in used]
    role_texts = [role_texts[int(i)] for i in rng.permutation(len(role_texts))]
    wanted = round(n_prompts * one_off_share)
    q_off = min(wanted // 2, len(questions) // 2)
    r_off = min(wanted - q_off, len(role_texts) // 2)
    one_offs = questions[:q_off] + role_texts[:r_off]
    pools = [_Pool(questions[q_off:], rng)]
    if len(role_texts) - r_off >= MIN_POOL:  # a few texts would repeat whole prompts
        pools.append(_Pool(role_texts[r_off:], rng))
    weights = np.arange(1, len(templates) + 1, dtype=float) ** -zipf_s
    shares = weights[rng.permutation(len(weights))] / weights.sum()
    counts = rng.multinomial(n_prompts - len(one_offs), shares)
    prompts, labels = list(one_offs), [-1] * len(one_offs)
    for label, (template, count) in enumerate(zip(templates, counts, strict=True)):
        pool = pools[int(rng.integers(0, len(pools)))]  # one filler source per template
        prompts += [_fill(template, pool) for _ in range(int(count))]
        labels += [label] * int(count)
    order = rng.permutation(len(prompts))
    return TemplatedWorkload([prompts[i] for i in order], [labels[i] for i in order], templates)


def _fill(template: str, source: _Pool) -> str:
    pieces = template.split(SLOT)
    out = [pieces[0]]
    for piece in pieces[1:]:
        out += [source.draw(), piece]
    return "".join(out)

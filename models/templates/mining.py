"""Template mining: the constant parts and slots behind a tenant's prompts.

The pipeline, per end of the prompt (openings first, then closings for slot-first templates):

1. Structure (`structure.py`): every distinct prompt's longest opening shared with at least
   `min_support` prompts; these openings and their branch points form a tree of candidates.
2. Embeddings of the CONSTANT parts (`clustering.py`): weighted DBSCAN (cosine, eps 0.35,
   min_samples 5) over the tree's edges decides where structure is ambiguous: whether a longer
   shared opening is the same template with a filler's first words ("...analyst: who") or a
   different template ("...act as a Poet."). Embedding whole prompts instead lets the variable
   content dominate: ARI 0.18 against 0.9998+ on the development workload.
3. Acceptance (`accept.py`): forks between templates and instructions under a shared system
   prompt are split off, and a cluster becomes a template only if its constant is a whole
   instruction (a boundary before the slot, or the closure test), which is what keeps one-off
   prompts that merely start alike ("how many episodes of ...") unassigned.
4. Consensus (`consensus.py`): the constant parts every member shares, with `<*>` between them.
5. Settling (`settle.py`): every prompt is assigned with the matcher `assign` uses (so mining and
   `assign` never disagree); templates left under `min_support`, and refinements that mean the
   same as a more general template, are dropped until nothing changes.

The measured choices (DBSCAN vs HDBSCAN vs no embeddings, and whole-prompt clustering) are
printed by `benchmarks/templates.py` and summarised in the docstring of `clustering.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from models.templates.accept import Acceptor, render
from models.templates.clustering import METHODS, cluster_nodes
from models.templates.consensus import consensus_pattern
from models.templates.ids import stable_ids
from models.templates.mined import MinedTemplate, MinedTemplates
from models.templates.pattern import Pattern
from models.templates.settle import settle
from models.templates.structure import ConstantNode, constant_tree, members_of, shared_depths
from models.templates.tokens import GAP, Tokens, tokenize

Embed = Callable[[list[str]], np.ndarray]
BACKGROUND = 300
EMBED_WORDS = 48


@dataclass(frozen=True)
class MiningConfig:
    """Knobs of `mine_templates`; the defaults are the issue's seed values where it has them.

    Attributes:
        min_support: distinct prompts a template needs (DBSCAN's min_samples).
        eps: cosine-distance radius for merging constants (and refinements, `settle.py`).
        method: "dbscan" (default), "hdbscan", "flat" or "structure" (see `clustering.py`).
        min_constant_words: words a shared opening needs to be a candidate at all.
        closure_words: words past the constant that the closure test looks at.
        closure: the cosine similarity the closure test needs (see `accept.py`).
        representatives: example prompts kept per template.
        reuse_jaccard: constant-token Jaccard at which a re-mined template keeps its old id.
    """

    min_support: int = 5
    eps: float = 0.35
    method: str = "dbscan"
    min_constant_words: int = 3
    closure_words: int = 3
    closure: float = 0.72
    representatives: int = 3
    reuse_jaccard: float = 0.8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {METHODS}")
        if self.min_support < 2:
            raise ValueError("min_support must be at least 2: one prompt is not a template")
        if not 0.0 < self.eps < 1.0:
            raise ValueError("eps is a cosine distance in (0, 1)")


def _validated(prompts: Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        raise TypeError("prompts must be a sequence of str, not one str")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to mine")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompt {i} is a {type(prompt).__name__}, not a str")
    return prompts


def _ends(tokens: Tokens, at_start: bool) -> tuple[str, ...]:
    """The opening (up to a cut) or the reversed closing (after a cut) of a prompt."""
    words = tokens.words
    if GAP in words:
        cut = words.index(GAP)
        return words[:cut] if at_start else tuple(reversed(words[cut + 1 :]))
    return words if at_start else tuple(reversed(words))


class _Miner:
    """One mining run's state: the distinct prompts, the embedder and the config."""

    def __init__(self, tokens: list[Tokens], embed: Embed | None, config: MiningConfig) -> None:
        self.tokens, self.embed, self.config = tokens, embed, config
        step = max(len(tokens) // BACKGROUND, 1)
        self.background = list(range(0, len(tokens), step))[:BACKGROUND]

    def patterns(self, at_start: bool) -> list[Pattern]:
        cfg = self.config
        sequences = [_ends(t, at_start) for t in self.tokens]
        depths = shared_depths(sequences, cfg.min_support)
        nodes = constant_tree(sequences, depths, cfg.min_constant_words)
        vectors = None
        if cfg.method != "structure" and nodes:
            texts = [self._node_text(node, at_start) for node in nodes]
            vectors = self._embed(texts)
        groups = cluster_nodes(nodes, vectors, cfg.eps, cfg.min_support, cfg.method)
        acceptor = Acceptor(self.tokens, self._embed, cfg, self.background)
        found = []
        for group in groups:
            for chosen, anchor_len in acceptor.accepted(nodes, group, sequences, at_start):
                pattern = self._consensus(members_of(nodes, chosen), at_start, anchor_len)
                if pattern is not None:
                    found.append(pattern)
        return found

    def _embed(self, texts: list[str]) -> np.ndarray:
        """Unit embeddings of the texts' last `EMBED_WORDS` words.

        The words nearest the slot are what tell a constant from its neighbours in the tree (a
        long shared system prompt is the same in all of them), and the cost of MiniLM grows with
        the length: cut, 10k prompts mine in a third of the time.
        """
        assert self.embed is not None
        texts = [" ".join(text.split()[-EMBED_WORDS:]) for text in texts]
        vectors = np.asarray(self.embed(texts), dtype=np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    def _node_text(self, node: ConstantNode, at_start: bool) -> str:
        return render(self.tokens[node.example], len(node.tokens), at_start)

    def similar(self, a: Pattern, b: Pattern) -> bool:
        """Whether two constants mean the same: cosine distance within `eps`."""
        va, vb = self._embed([" ".join(a.constant_tokens), " ".join(b.constant_tokens)])
        return float(va @ vb) >= 1.0 - self.config.eps

    def _consensus(self, members: list[int], at_start: bool, anchor_len: int) -> Pattern | None:
        inside = set(members)
        background = [self.tokens[i].words for i in self.background if i not in inside]
        words = [self.tokens[i].words for i in members]
        return consensus_pattern(words, at_start, anchor_len, background)


def mine_templates(
    prompts: Sequence[str],
    embed: Embed | None = None,
    config: MiningConfig | None = None,
    previous: Mapping[str, str] | None = None,
) -> MinedTemplates:
    """Mine the templates behind `prompts` (one tenant's).

    Args:
        prompts: the prompts, repeats included (volume counts them; support counts distinct).
        embed: texts -> (N, D) embeddings; default the shared MiniLM embedder. Only the
            candidate constants are embedded (tens to hundreds of short texts), never prompts.
        config: the knobs (`MiningConfig`).
        previous: old template id -> constant text, so templates that barely changed keep ids.

    Raises:
        ValueError: no prompts. TypeError: a prompt that is not a str.
    """
    prompts = _validated(prompts)
    config = config or MiningConfig()
    if embed is None and config.method != "structure":
        from models.templates.embeddings import shared_embedder

        embed = shared_embedder().embed
    distinct: dict[tuple[str, ...], int] = {}
    tokens: list[Tokens] = []
    of_prompt = []
    for prompt in prompts:
        t = tokenize(prompt)
        of_prompt.append(distinct.setdefault(t.words, len(tokens)))
        if of_prompt[-1] == len(tokens):
            tokens.append(t)
    miner = _Miner(tokens, embed, config)
    patterns = miner.patterns(at_start=True) + miner.patterns(at_start=False)
    similar = miner.similar if config.method != "structure" else None
    labels = settle(patterns, tokens, config.min_support, similar)
    return _build(patterns, labels, tokens, of_prompt, config, previous)


def _build(
    patterns: list[Pattern],
    labels: list[int | None],
    tokens: list[Tokens],
    of_prompt: list[int],
    config: MiningConfig,
    previous: Mapping[str, str] | None,
) -> MinedTemplates:
    ids = stable_ids(patterns, previous, config.reuse_jaccard)
    volume = np.zeros(len(patterns), dtype=np.int64)
    for d in of_prompt:
        if labels[d] is not None:
            volume[labels[d]] += 1
    members: list[list[int]] = [[] for _ in patterns]
    for d, label in enumerate(labels):
        if label is not None:
            members[label].append(d)
    templates = [
        MinedTemplate(
            template_id=ids[i],
            constant_text=pattern.render(tokens[members[i][0]]),
            pattern=pattern,
            volume=int(volume[i]),
            support=len(members[i]),
            representatives=tuple(tokens[d].text for d in members[i][: config.representatives]),
        )
        for i, pattern in enumerate(patterns)
    ]
    prompt_labels = [None if labels[d] is None else ids[labels[d]] for d in of_prompt]
    return MinedTemplates(templates, prompt_labels)

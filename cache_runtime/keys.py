"""Cache keys: frozen dataclasses with a reversible, versioned string form.

Every key carries its tenant and the key-format version, and exact and prefix keys carry the model
id, so a key of one tenant, model or format version can never equal — or share a string with —
a key of another. String form: `ph|v<version>|<kind>|<field>|<field>...` with each text field
percent-encoded, so a tenant named `a|b` cannot forge a key of tenant `a`.

Rejected alternative: hashing the whole tuple into one opaque digest. It is as safe but makes
keys unreadable in Redis and in logs, and a tenant namespace (`KEYS ph|v1|exact|acme|*`, ACL key
patterns) impossible.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import quote, unquote

from cache_runtime.prefix_hash import chain_block_hashes

KEY_FORMAT_VERSION = 1
_MAGIC = "ph"
_WHITESPACE = re.compile(r"\s+")


def _enc(text: str) -> str:
    if not text:
        raise ValueError("key fields must be non-empty")
    return quote(text, safe="")


def normalise_prompt(prompt: str) -> str:
    """Unicode NFC, trimmed, runs of whitespace collapsed. Case and punctuation are kept:
    "Sell" and "sell?" may ask different things, and an exact hit must be exact."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", prompt)).strip()


def _join(kind: str, version: int, fields: tuple[str, ...]) -> str:
    """The string form; `_split` is its inverse."""
    return f"{_MAGIC}|v{version}|{kind}|{'|'.join(fields)}"


def _split(text: str, kind: str, fields: int) -> tuple[int, list[str]]:
    parts = text.split("|")
    if len(parts) != 3 + fields or parts[0] != _MAGIC or parts[2] != kind:
        raise ValueError(f"not a {kind} key: {text[:120]!r}")
    if not parts[1].startswith("v") or not parts[1][1:].isdigit():
        raise ValueError(f"bad key format version in {text[:120]!r}")
    if any(p == "" for p in parts[3:]):
        raise ValueError(f"empty field in {text[:120]!r}")
    return int(parts[1][1:]), parts[3:]


@dataclass(frozen=True, slots=True)
class ExactKey:
    """A response for exactly this prompt, of this model, for this tenant."""

    tenant: str
    model_id: str
    prompt_digest: str
    version: int = KEY_FORMAT_VERSION
    kind: ClassVar[str] = "exact"

    @classmethod
    def of(cls, tenant: str, model_id: str, prompt: str) -> ExactKey:
        digest = hashlib.blake2b(normalise_prompt(prompt).encode(), digest_size=16).hexdigest()
        return cls(tenant, model_id, digest)

    def to_string(self) -> str:
        fields = (_enc(self.tenant), _enc(self.model_id), _enc(self.prompt_digest))
        return _join(self.kind, self.version, fields)

    @classmethod
    def from_string(cls, text: str) -> ExactKey:
        version, (tenant, model, digest) = _split(text, cls.kind, 3)
        return cls(unquote(tenant), unquote(model), unquote(digest), version)


@dataclass(frozen=True, slots=True)
class EmbeddingKey:
    """An embedding of exactly this text, by this encoder, for this tenant. Its own kind, not an
    `ExactKey`: an embedding is a function of the text and the model, so it never goes stale and
    needs no generation (`generations.py`), unlike an answer."""

    tenant: str
    model_id: str
    text_digest: str
    version: int = KEY_FORMAT_VERSION
    kind: ClassVar[str] = "embedding"

    @classmethod
    def of(cls, tenant: str, model_id: str, text: str) -> EmbeddingKey:
        digest = hashlib.blake2b(normalise_prompt(text).encode(), digest_size=16).hexdigest()
        return cls(tenant, model_id, digest)

    def to_string(self) -> str:
        fields = (_enc(self.tenant), _enc(self.model_id), _enc(self.text_digest))
        return _join(self.kind, self.version, fields)

    @classmethod
    def from_string(cls, text: str) -> EmbeddingKey:
        version, (tenant, model, digest) = _split(text, cls.kind, 3)
        return cls(unquote(tenant), unquote(model), unquote(digest), version)


@dataclass(frozen=True, slots=True)
class SemanticKey:
    """A bucket of similar prompts of one template: a hit still needs verification (issue 6)."""

    tenant: str
    template_id: str
    simhash: int
    version: int = KEY_FORMAT_VERSION
    kind: ClassVar[str] = "semantic"

    def __post_init__(self) -> None:
        if not 0 <= self.simhash < 2**64:
            raise ValueError("simhash must be an unsigned 64-bit integer")

    def to_string(self) -> str:
        fields = (_enc(self.tenant), _enc(self.template_id), f"{self.simhash:016x}")
        return _join(self.kind, self.version, fields)

    @classmethod
    def from_string(cls, text: str) -> SemanticKey:
        version, (tenant, template, simhash) = _split(text, cls.kind, 3)
        if not re.fullmatch(r"[0-9a-f]{16}", simhash):
            raise ValueError(f"bad simhash in {text[:120]!r}")
        return cls(unquote(tenant), unquote(template), int(simhash, 16), version)


def prefix_root(tenant: str, model_id: str, version: int = KEY_FORMAT_VERSION) -> int:
    """The parent hash of a prefix's first block: per tenant, model and format version, so equal
    tokens under another tenant or model chain to unrelated hashes."""
    seed = f"{version}\x1f{tenant}\x1f{model_id}".encode()
    return int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "little", signed=True)


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """One KV page: the block at `depth` of a prompt whose chained hash up to it is `block_hash`.

    `root_hash` is the chain's first block hash (its own hash at depth 0): it names the chain, so
    a Redis Cluster tier can keep all pages of one chain on one slot (a hash tag), and a longest
    prefix lookup is one round trip to one node.
    """

    tenant: str
    model_id: str
    depth: int
    block_hash: int
    root_hash: int
    version: int = KEY_FORMAT_VERSION
    kind: ClassVar[str] = "prefix"

    def __post_init__(self) -> None:
        in_range = all(-(2**63) <= h < 2**63 for h in (self.block_hash, self.root_hash))
        if self.depth < 0 or not in_range:
            raise ValueError("depth must be >= 0 and hashes signed 64-bit integers")
        if self.depth == 0 and self.root_hash != self.block_hash:
            raise ValueError("at depth 0 the root hash is the block hash")

    @classmethod
    def chain(cls, tenant: str, model_id: str, blocks: Sequence[Sequence[int]]) -> list[PrefixKey]:
        """Keys of consecutive token blocks of one prompt, each naming the prefix up to it."""
        hashes = chain_block_hashes(blocks, parent=prefix_root(tenant, model_id))
        if not hashes:
            return []
        return [cls(tenant, model_id, depth, h, hashes[0]) for depth, h in enumerate(hashes)]

    def to_string(self) -> str:
        fields = (
            _enc(self.tenant), _enc(self.model_id), str(self.depth), str(self.block_hash),
            str(self.root_hash),
        )  # fmt: skip
        return _join(self.kind, self.version, fields)

    @classmethod
    def from_string(cls, text: str) -> PrefixKey:
        version, (tenant, model, depth, block_hash, root) = _split(text, cls.kind, 5)
        numbers = (block_hash, root)
        if not depth.isdigit() or not all(re.fullmatch(r"-?\d+", n) for n in numbers):
            raise ValueError(f"bad depth or hash in {text[:120]!r}")
        return cls(unquote(tenant), unquote(model), int(depth), int(block_hash), int(root), version)


CacheKey = ExactKey | EmbeddingKey | SemanticKey | PrefixKey
_KINDS: dict[str, type[ExactKey] | type[EmbeddingKey] | type[SemanticKey] | type[PrefixKey]] = {
    k.kind: k for k in (ExactKey, EmbeddingKey, SemanticKey, PrefixKey)
}


def parse_key(text: str) -> CacheKey:
    """Any key from its string form; `ValueError` for anything else."""
    parts = text.split("|", 3)
    if len(parts) < 4 or parts[2] not in _KINDS:
        raise ValueError(f"not a cache key: {text[:120]!r}")
    return _KINDS[parts[2]].from_string(text)

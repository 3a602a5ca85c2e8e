"""Static-shape target forwards for the native engine, captured as CUDA graphs on CUDA.

A decode or verify step of the eager engine runs the target on exactly the running rows and exactly the cache
slots in use, so its shapes change every step and a GPU spends the long tail launching kernels. Here the running
rows are padded to a batch bucket (a power of two) and attention runs over a KV-length bucket (a multiple of 128,
at most the cache), so a step has one of few shapes: (rows, new tokens per row, KV slots, causal or tree mask).
On CUDA each shape is captured once, on first use, as a CUDA graph (tlt.models.graphs: one memory pool for all)
and replayed after. On CPU the same static path runs uncaptured,
which is how CI checks its output.

Padding rows feed token 0 at cache length 0: they write K/V only into their own cache rows, which belong to no
running sequence (rows at and beyond the running count are free), and their outputs are dropped.
"""

from __future__ import annotations

import torch

from tlt.models.graphs import Graphs, batch_bucket, kv_bucket, pad_rows
from tlt.models.lean import KVCache, LeanModel


class StaticForward:
    """`LeanModel.forward` on bucketed shapes over a cache buffer with at least `batch_bucket(rows)` rows."""

    def __init__(self, lean: LeanModel, capture: bool):
        self.lean = lean
        self.graphs = Graphs(capture)

    def __call__(
        self,
        buffer: KVCache,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache_lens: torch.Tensor,
        tree_mask: torch.Tensor | None,
        kv_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [B, Q, D], logits [B, Q, V]) of the B running rows (rows 0..B-1 of `buffer`); kv_len is an
        upper bound on max(cache_lens) + Q."""
        B, Q = tokens.shape
        rows, slots = batch_bucket(B), kv_bucket(kv_len, buffer.max_len)
        if rows > buffer.batch:
            raise ValueError(f"the static path needs a cache of {rows} rows for {B} running rows, has {buffer.batch}")
        cache = KVCache(k=buffer.k[:, :rows], v=buffer.v[:, :rows])

        def forward(tokens, positions, cache_lens, tree_mask):
            return self.lean.forward(tokens, positions, cache, cache_lens, tree_mask=tree_mask, kv_len=slots)

        key = (rows, Q, slots, tree_mask is not None)
        padded = _pad(rows, tokens, positions, cache_lens, tree_mask)
        hidden, logits = self.graphs.run(key, forward, padded, warmup=_warmup(rows, Q, slots, tree_mask, tokens.device))
        return hidden[:B], logits[:B]


def _warmup(rows: int, Q: int, slots: int, tree_mask, device) -> tuple:
    """Inputs of the capture runs: they write K/V at slots [S - Q, S) of every row, beyond every running row's
    cache (S >= its length + Q), where this step's own tokens are written next anyway."""
    cache_lens = torch.full((rows,), slots - Q, dtype=torch.long, device=device)
    positions = cache_lens[:, None] + torch.arange(Q, device=device)
    mask = None if tree_mask is None else _causal(rows, Q, device)
    return torch.zeros(rows, Q, dtype=torch.long, device=device), positions, cache_lens, mask


def _causal(rows: int, Q: int, device) -> torch.Tensor:
    return torch.ones(Q, Q, dtype=torch.bool, device=device).tril().expand(rows, Q, Q).contiguous()


def _pad(rows: int, tokens, positions, cache_lens, tree_mask) -> tuple:
    """The step's inputs with rows B..rows-1 added: token 0 at cache length 0, a causal mask."""
    B, Q = tokens.shape
    if rows == B:
        return tokens, positions, cache_lens, tree_mask
    device = tokens.device
    positions = torch.cat([positions, torch.arange(Q, device=device).expand(rows - B, Q)])
    mask = None if tree_mask is None else torch.cat([tree_mask, _causal(rows - B, Q, device)])
    return pad_rows(tokens, rows), positions, pad_rows(cache_lens, rows), mask

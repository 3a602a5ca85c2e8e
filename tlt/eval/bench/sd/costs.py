"""The SD cost model: target forward time t(b, N) over a filled cache, and the speedup bound it implies.

Per row, plain decoding yields 1 token per forward t(b, 1); an SD iteration yields A = accepted + 1 tokens
for one verify forward t(b, N) (N = verify_tokens) plus K draft steps of t_draft(b) each (measured where
they run, as the drafter's `propose` time; K = steps). So SD can at best be

    A * t(b, 1) / (t(b, N) + K * t_draft(b))

times faster. The bound leaves out what both engines pay per step besides the forward (sampling, tree
verification, cache commit, Python), so measured speedup / bound says how close the engine gets to its forward
costs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from tlt.models.lean import LeanModel


@dataclass(frozen=True)
class ForwardCost:
    """Median wall time of one target forward."""

    batch_size: int  # b rows
    new_tokens: int  # N query tokens per row (1 = a plain decode step)
    cache_len: int  # cached tokens per row before the forward
    seconds: float


def forward_seconds(lean: LeanModel, batch_size: int, new_tokens: int, cache_len: int, reps: int) -> float:
    """Median of `reps` LeanModel.forward calls (after one warm-up) of N chained tokens per row."""
    B, N = batch_size, new_tokens
    cache = lean.allocate_cache(B, cache_len + N)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(lean.vocab_size, (B, N), generator=generator).to(lean.device)  # [B, N]
    cache_lens = torch.full((B,), cache_len, device=lean.device)  # [B]
    positions = cache_lens[:, None] + torch.arange(N, device=lean.device)  # [B, N]
    chain = torch.ones(N, N, dtype=torch.bool, device=lean.device).tril().expand(B, N, N)  # the verify path
    tree_mask = chain if N > 1 else None
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        lean.forward(tokens, positions, cache, cache_lens, tree_mask=tree_mask, kv_len=cache_len + N)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def measure_costs(
    model: torch.nn.Module, batch_sizes: list[int], new_tokens: list[int], cache_len: int, reps: int
) -> list[ForwardCost]:
    """t(b, N) for every batch size and N; cache_len is clamped to the model's context."""
    lean = LeanModel.from_hf(model)
    costs = []
    for b in batch_sizes:
        for n in sorted(set(new_tokens)):
            length = min(cache_len, lean.max_positions - n)
            costs.append(ForwardCost(b, n, length, forward_seconds(lean, b, n, length, reps)))
    return costs


def speedup_bound(tokens_per_verify: float, t_plain: float, t_verify: float, propose_seconds: float) -> float:
    """A * t(b, 1) / (t(b, N) + K * t_draft(b)), with K * t_draft(b) = the drafter's time per SD iteration."""
    return tokens_per_verify * t_plain / (t_verify + propose_seconds)

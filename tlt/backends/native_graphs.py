"""Static-shape target forwards for the native engine, captured as CUDA graphs on CUDA.

A decode or verify step of the eager engine runs the target on exactly the running rows and exactly the cache
slots in use, so its shapes change every step and a GPU spends the long tail launching kernels. Here the running
rows are padded to a batch bucket (a power of two) and attention runs over a KV-length bucket (a multiple of 128,
at most the cache), so a step has one of few shapes: (rows, new tokens per row, KV slots, causal or tree mask).
On CUDA each shape is captured once, on first use, as a `torch.cuda.CUDAGraph`; the graphs share one memory pool
(as the paper's rollout engine and vLLM's / SGLang's graph runners keep one pool across batch sizes) and a step
copies its inputs into the graph's static tensors and replays it. On CPU the same static path runs uncaptured,
which is how CI checks its output.

Padding rows feed token 0 at cache length 0: they write K/V only into their own cache rows, which belong to no
running sequence (rows at and beyond the running count are free), and their outputs are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tlt.models.lean import KVCache, LeanModel

KV_BLOCK = 128


def batch_bucket(rows: int) -> int:
    """The smallest power of two >= rows."""
    return 1 << max(rows - 1, 0).bit_length()


def kv_bucket(kv_len: int, capacity: int) -> int:
    """The smallest multiple of KV_BLOCK >= kv_len, at most the cache's capacity."""
    return min(-(-kv_len // KV_BLOCK) * KV_BLOCK, capacity)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # [Bb, Q] static inputs, copied in before each replay
    positions: torch.Tensor
    cache_lens: torch.Tensor  # [Bb]
    tree_mask: torch.Tensor | None  # [Bb, Q, Q]
    hidden: torch.Tensor  # [Bb, Q, D] static outputs, overwritten by each replay
    logits: torch.Tensor  # [Bb, Q, V]


class StaticForward:
    """`LeanModel.forward` on bucketed shapes over a cache buffer with at least `batch_bucket(rows)` rows."""

    def __init__(self, lean: LeanModel, capture: bool):
        self.lean = lean
        self.capture = capture
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = None  # the graphs' shared memory pool

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
        padded = _pad(rows, tokens, positions, cache_lens, tree_mask)
        if not self.capture:
            hidden, logits = self.lean.forward(*padded[:2], cache, padded[2], tree_mask=padded[3], kv_len=slots)
            return hidden[:B], logits[:B]
        key = (rows, Q, slots, tree_mask is not None)
        graph = self.graphs.get(key) or self._capture(key, cache)
        inputs = (graph.tokens, graph.positions, graph.cache_lens, graph.tree_mask)
        for static, value in zip(inputs, padded, strict=True):
            if static is not None:
                static.copy_(value)
        graph.graph.replay()
        return graph.hidden[:B].clone(), graph.logits[:B].clone()  # the next replay overwrites the outputs

    def _capture(self, key: tuple, cache: KVCache) -> _Graph:
        """Capture the forward of one shape. The warm-up runs write K/V at slots [S - Q, S) of every row, beyond
        every running row's cache (S >= its length + Q), where this step's own tokens are written next anyway."""
        rows, Q, slots, tree = key
        device = cache.k.device
        tokens = torch.zeros(rows, Q, dtype=torch.long, device=device)
        cache_lens = torch.full((rows,), slots - Q, dtype=torch.long, device=device)
        positions = cache_lens[:, None] + torch.arange(Q, device=device)
        mask = _causal(rows, Q, device) if tree else None

        def run():
            return self.lean.forward(tokens, positions, cache, cache_lens, tree_mask=mask, kv_len=slots)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisation (cuBLAS workspaces, SDPA backend choice) outside the graph
                run()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden, logits = run()
        self.pool = graph.pool()
        self.graphs[key] = _Graph(graph, tokens, positions, cache_lens, mask, hidden, logits)
        return self.graphs[key]


def _causal(rows: int, Q: int, device) -> torch.Tensor:
    return torch.ones(Q, Q, dtype=torch.bool, device=device).tril().expand(rows, Q, Q).contiguous()


def _pad(rows: int, tokens, positions, cache_lens, tree_mask) -> tuple:
    """The step's inputs with rows B..rows-1 added: token 0 at cache length 0, a causal mask."""
    B, Q = tokens.shape
    extra = rows - B
    if extra == 0:
        return tokens, positions, cache_lens, tree_mask
    device = tokens.device
    zeros = torch.zeros(extra, Q, dtype=torch.long, device=device)
    positions = torch.cat([positions, torch.arange(Q, device=device).expand(extra, Q)])
    mask = None if tree_mask is None else torch.cat([tree_mask, _causal(extra, Q, device)])
    return torch.cat([tokens, zeros]), positions, torch.cat([cache_lens, zeros[:, 0]]), mask

"""Forwards on static shapes, captured as CUDA graphs: one graph per shape key, replayed after the first call.

A call passes a function of fixed-shape tensors and a key naming its shapes; with capture off (CPU) it runs the
function as is. With capture on, the first call of a key warms the
function up on a side stream (lazy initialisation such as cuBLAS workspaces stays outside the graph), captures
it into a `torch.cuda.CUDAGraph` whose input tensors are static copies, and every call copies its inputs into
them and replays. All graphs of one `Graphs` share one memory pool, as the paper's rollout engine (and vLLM's and
SGLang's graph runners) keep one pool across batch sizes. The function may read and write long-lived buffers
(weights, KV caches) besides its inputs, but must run the same kernels for the same key; its warm-up runs
execute for real, so whatever they write must be harmless (scratch slots, or the values the replay writes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

KV_BLOCK = 128  # attention runs over a multiple of this many cache slots


def batch_bucket(rows: int) -> int:
    """The smallest power of two >= rows."""
    return 1 << max(rows - 1, 0).bit_length()


def kv_blocks(kv_len: int) -> int:
    """The smallest multiple of KV_BLOCK >= kv_len."""
    return -(-kv_len // KV_BLOCK) * KV_BLOCK


def kv_bucket(kv_len: int, capacity: int) -> int:
    """kv_blocks(kv_len), at most the cache's capacity."""
    return min(kv_blocks(kv_len), capacity)


def pad_rows(x: torch.Tensor, rows: int, value: int | float = 0) -> torch.Tensor:
    """x [B, ...] with rows B..rows-1 filled with `value`."""
    extra = rows - x.shape[0]
    return x if extra == 0 else torch.cat([x, x.new_full((extra, *x.shape[1:]), value)])


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple  # static tensors (or None) the inputs are copied into
    outputs: tuple  # static tensors each replay overwrites


class Graphs:
    def __init__(self, capture: bool):
        self.capture = capture
        self.captured: dict[tuple, _Captured] = {}
        self.pool = None

    def run(
        self,
        key: tuple,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        inputs: tuple,
        warmup: tuple | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """fn(*inputs) (a tuple of tensors), replayed from the key's graph when capturing. `warmup`: the inputs
        of the warm-up and capture runs (default: `inputs`)."""
        if not self.capture:
            return fn(*inputs)
        entry = self.captured.get(key) or self._capture(key, fn, inputs if warmup is None else warmup)
        for static, value in zip(entry.inputs, inputs, strict=True):
            if static is not None:
                static.copy_(value)
        entry.graph.replay()
        return tuple(out.clone() for out in entry.outputs)  # the next replay overwrites the outputs

    def _capture(self, key: tuple, fn: Callable, warmup: tuple) -> _Captured:
        static = tuple(None if x is None else x.clone() for x in warmup)
        device = next(x for x in static if x is not None).device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = fn(*static)
        self.pool = graph.pool()
        self.captured[key] = _Captured(graph, static, outputs)
        return self.captured[key]

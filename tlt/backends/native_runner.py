"""The native engine's model runner: one target forward per call (prefill, plain decode step, tree verify)."""

from __future__ import annotations

import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native_graphs import StaticForward
from tlt.backends.native_state import Emission, RunningBatch
from tlt.models.graphs import batch_bucket
from tlt.models.lean import KVCache, LeanModel, commit_path, compact
from tlt.speculative.sampling import probs_from_logits, sample_tokens, token_logprobs
from tlt.speculative.tree import DraftTree
from tlt.speculative.verify import emitted_tokens, verify_chain_with_draft_probs, verify_tree


def next_tokens(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """[B, V] logits -> [B] tokens from the target distribution (argmax when greedy: no RNG draw)."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    return sample_tokens(probs_from_logits(logits, sampling), generator)


class ModelRunner:
    """Owns the target's LeanModel and KV cache (capacity `max_seq_len` slots per row).

    static: decode and verify forwards on bucketed shapes (`native_graphs.StaticForward`), captured as CUDA
    graphs when the model is on CUDA; eager shapes otherwise.
    """

    # chains skip the ancestor mask and the commit (`speculate`); eval/bench_chain_path.py turns it off to measure
    # what that saves
    chain_shortcut = True

    def __init__(self, lean: LeanModel, max_seq_len: int, static: bool = False):
        self.lean = lean
        self.max_seq_len = max_seq_len
        self.cache: KVCache | None = None  # the running rows (a view of the buffer)
        self._buffer: KVCache | None = None
        self.static = StaticForward(lean, capture=lean.device.type == "cuda") if static else None

    def _forward(self, tokens, positions, cache_lens, kv_len: int, tree_mask=None, real: list[int] | None = None):
        """The target on the running rows: [B, Q] new tokens -> (hidden [B, Q, D], logits [B, Q, V]). `real`:
        per row, how many leading new tokens count; the eager path computes only those (the static path, on fixed
        shapes, all of them)."""
        if self.static is not None:
            return self.static(self._buffer, tokens, positions, cache_lens, tree_mask, kv_len)
        select = None
        if real is not None and sum(real) < tokens.numel():
            Q = tokens.shape[1]
            select = torch.tensor([b * Q + j for b, n in enumerate(real) for j in range(n)], device=tokens.device)
        return self.lean.forward(
            tokens, positions, self.cache, cache_lens, tree_mask=tree_mask, kv_len=kv_len, select=select
        )

    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill P right-padded prompts [P, T] (lengths [P]) once, then fork each into n cache rows.

        Returns (hidden [P, T, D] of every prompt token, logits [P, V] at each prompt's last token).
        """
        P, T = tokens.shape
        full = self._allocate(P * n)
        view = KVCache(k=full.k[:, :P], v=full.v[:, :P])
        positions = torch.arange(T, device=tokens.device).expand(P, T)
        zeros = torch.zeros(P, dtype=torch.long, device=tokens.device)
        last = (lengths - 1)[:, None]  # [P, 1]
        hidden, logits = self.lean.forward(tokens, positions, view, zeros, kv_len=T, logits_at=last)
        rows = torch.arange(P, device=tokens.device).repeat_interleave(n)
        self.cache = compact(full, rows, kv_len=T)
        return hidden, logits[:, 0]

    def _allocate(self, rows: int) -> KVCache:
        """A cache view with `rows` rows; the buffer is reused across generate() calls when it is large
        enough."""
        need = rows if self.static is None else batch_bucket(rows)  # padding rows of the static path
        if self._buffer is None or self._buffer.batch < need:
            self._buffer = self.lean.allocate_cache(need, self.max_seq_len)
            if self.static is not None:
                self.static = StaticForward(self.lean, self.static.graphs.capture)  # graphs point into the old buffer
        return KVCache(k=self._buffer.k[:, :rows], v=self._buffer.v[:, :rows])

    def keep(self, rows: torch.Tensor, kv_len: int) -> None:
        self.cache = compact(self.cache, rows, kv_len=kv_len)

    def decode(
        self, batch: RunningBatch, kv_len: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Emission:
        """One plain step: feed each row's pending token, sample the next one."""
        hidden, logits = self._forward(
            batch.pending[:, None], batch.cache_lens[:, None], batch.cache_lens, kv_len
        )  # [B, 1, D], [B, 1, V]
        tokens = next_tokens(logits[:, 0], sampling, generator)  # [B]
        return Emission(
            tokens=tokens[:, None],
            counts=torch.ones_like(tokens),
            logprobs=token_logprobs(logits, tokens[:, None], sampling),
            prev_hidden=hidden,
        )

    def speculate(
        self,
        batch: RunningBatch,
        tree: DraftTree,
        levels: int,
        kv_len: int,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[Emission, torch.Tensor]:
        """Verify a draft tree [B, N] at most `levels` deep in one forward, commit the accepted path; returns
        (emission, accepted [B]).

        The root's token is taken from the batch (the pending token) so the cache never sees a wrong root. A chain
        (`DraftTree.is_chain`) attends causally and is committed where it was written: its accepted path is a
        prefix of its nodes, already at the slots a commit would move them to, so the ancestor mask, the commit
        and the gathers along the path are skipped (ops a CPU pays for one by one).
        """
        tokens = torch.cat([batch.pending[:, None], tree.tokens[:, 1:]], dim=1)  # [B, N]
        tree = DraftTree(tokens=tokens, parents=tree.parents, draft_probs=tree.draft_probs, real=tree.real)
        chain = self.chain_shortcut and tree.is_chain()
        if chain:
            mask, depths = None, torch.arange(tree.num_nodes, device=tokens.device)[None, :]
        else:
            mask = tree.ancestor_mask()  # [B, N, N]
            depths = mask.sum(dim=-1) - 1  # [B, N]: a node's depth is its ancestors
        hidden, logits = self._forward(
            tokens, batch.cache_lens[:, None] + depths, batch.cache_lens, kv_len, tree_mask=mask, real=tree.real
        )  # [B, N, D], [B, N, V]
        if tree.draft_probs is None:
            result = verify_tree(tree, logits, sampling, generator, num_levels=levels)
        else:  # a chain sampled from known q: row i of logits predicts chain node i + 1
            result = verify_chain_with_draft_probs(tree.tokens[:, 1:], tree.draft_probs, logits, sampling, generator)
        emitted, counts = emitted_tokens(tree, result)  # [B, K + 1], token j was predicted at node path[j]
        emitted = emitted.clamp(min=0)
        width = emitted.shape[1]
        if chain:  # path node j is node j (past the count: padding, never read)
            node_logits, node_hidden = logits[:, :width], hidden[:, :width]
        else:
            nodes = result.path.clamp(min=0)[:, :, None]  # [B, K + 1, 1]
            node_logits = logits.gather(1, nodes.expand(-1, -1, logits.shape[-1]))  # [B, K + 1, V]
            node_hidden = hidden.gather(1, nodes.expand(-1, -1, hidden.shape[-1]))
            commit_path(self.cache, batch.cache_lens, result.path)
        emission = Emission(
            tokens=emitted,
            counts=counts,
            logprobs=token_logprobs(node_logits, emitted, sampling),
            prev_hidden=node_hidden,
        )
        return emission, result.num_accepted

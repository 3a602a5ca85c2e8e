"""Typed records of one speculative-decoding iteration: the draft tree and the verification result."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A batch of draft trees with the same node count N.

    Node 0 of every row is the root: the last committed token, whose target distribution predicts the first
    draft level. Nodes are in topological order (`parents[b, i] < i`), and children of one parent appear in the
    order the verifier should try them (best draft first).
    """

    tokens: torch.Tensor  # [B, N] int64, token of each node; tokens[:, 0] is the root
    parents: torch.Tensor  # [B, N] int64, parent node index, -1 for the root
    # chains drafted by sampling: [B, N - 1, V], node i + 1 was sampled from draft_probs[:, i]; the verifier
    # then accepts with min(1, p / q) (~1 - TV(p, q) per token) instead of p(node) (None: drafts are fixed)
    draft_probs: torch.Tensor | None = None
    # model-free drafts of varying length: per row, how many leading nodes are drafted (the root included); the
    # nodes after them are filler that the verifier never accepts and the engine need not compute (None: all)
    real: list[int] | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    def real_mask(self) -> torch.Tensor | None:
        """[B, N] bool: the drafted nodes (None when every node is)."""
        if self.real is None:
            return None
        real = torch.tensor(self.real, device=self.tokens.device)
        return torch.arange(self.num_nodes, device=self.tokens.device)[None, :] < real[:, None]

    def narrow(self, width: int) -> DraftTree:
        """The first `width` nodes of every row (a tree whose drafted nodes all lie among them)."""
        real = None if self.real is None else [min(n, width) for n in self.real]
        probs = None if self.draft_probs is None else self.draft_probs[:, : width - 1]
        return DraftTree(self.tokens[:, :width], self.parents[:, :width], probs, real)

    def depths(self) -> torch.Tensor:
        """[B, N] depth of each node (root = 0), by pointer jumping: log2(N) gathers, not one per node."""
        up = self.parents.clamp(min=0)  # the root is its own parent
        depth = (self.parents >= 0).long()  # distance from each node to `up`
        for _ in range(_jumps(self.num_nodes)):
            depth = depth + depth.gather(1, up)
            up = up.gather(1, up)
        return depth

    def ancestor_mask(self) -> torch.Tensor:
        """[B, N, N] bool: mask[b, i, j] when node j is node i or one of its ancestors (tree attention); by
        pointer jumping as `depths`: mask[i] holds the path from i up to `up[i]`, which doubles each round."""
        B, N = self.parents.shape
        up = self.parents.clamp(min=0)
        eye = torch.eye(N, dtype=torch.bool, device=self.parents.device).expand(B, N, N)
        mask = eye | torch.nn.functional.one_hot(up, N).bool()
        for _ in range(_jumps(N)):
            mask = mask | mask.gather(1, up[:, :, None].expand(B, N, N))
            up = up.gather(1, up)
        return mask

    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it. Sampled drafts are chains by contract; a fixed
        draft's parents are read on the CPU only, where that costs no host sync (on an accelerator it counts as
        a tree: verifying and committing a chain as one is exact, only slower)."""
        if self.draft_probs is not None:
            return True
        return self.parents.device.type == "cpu" and self.has_chain_parents()

    def has_chain_parents(self) -> bool:
        """Whether the parents are -1, 0, 1, ..., N - 2 in every row (reads them: a host sync on an accelerator)."""
        return torch.equal(self.parents, _chain_parents(*self.parents.shape, device=self.parents.device))

    @staticmethod
    def chain(tokens: torch.Tensor) -> DraftTree:
        """A chain tree from [B, N] tokens (root first)."""
        return DraftTree(tokens=tokens, parents=_chain_parents(*tokens.shape, device=tokens.device).contiguous())


def _chain_parents(B: int, N: int, device: torch.device | None = None) -> torch.Tensor:
    """[B, N] parents of chains (-1, 0, 1, ..., N - 2), expanded (not contiguous)."""
    return torch.arange(-1, N - 1, device=device).expand(B, N)


def _jumps(num_nodes: int) -> int:
    """Pointer-jumping rounds that reach the root from any node of an N-node tree (depth <= N - 1)."""
    return max(num_nodes - 2, 0).bit_length()


@dataclass
class VerifyResult:
    """Outcome of verifying a DraftTree against the target."""

    path: torch.Tensor  # [B, K + 1] int64 node indices of the accepted path from the root, -1 padded
    num_accepted: torch.Tensor  # [B] int64 accepted draft tokens (root excluded), 0..K
    bonus: torch.Tensor  # [B] int64 token sampled from the target after the last accepted node

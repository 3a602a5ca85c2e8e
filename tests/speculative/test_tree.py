"""DraftTree's depths and ancestor mask against a walk up the parents, on random trees (chains and bushes)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tlt.speculative.tree import DraftTree


@st.composite
def trees(draw: st.DrawFn) -> DraftTree:
    """Rows of N nodes; each node's parent is the node before it (chains) or any earlier node."""
    B, N = draw(st.integers(1, 3)), draw(st.integers(1, 70))
    chain_bias = draw(st.floats(0.0, 1.0))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    parents = torch.full((B, N), -1, dtype=torch.long)
    for i in range(1, N):
        anywhere = (torch.rand(B, generator=g) * i).long()
        parents[:, i] = torch.where(torch.rand(B, generator=g) < chain_bias, i - 1, anywhere)
    return DraftTree(tokens=torch.zeros(B, N, dtype=torch.long), parents=parents)


def walk_up(parents: list[int], i: int) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path


@settings(max_examples=80, deadline=None)
@given(tree=trees())
def test_depths_and_ancestor_mask_match_a_walk_up_the_parents(tree: DraftTree) -> None:
    B, N = tree.parents.shape
    depths, mask = tree.depths(), tree.ancestor_mask()
    assert depths.shape == (B, N) and mask.shape == (B, N, N)
    for b in range(B):
        parents = tree.parents[b].tolist()
        for i in range(N):
            path = walk_up(parents, i)
            assert int(depths[b, i]) == len(path) - 1
            assert mask[b, i].nonzero().flatten().tolist() == sorted(path)

"""Exact and property tests for tlt.speculative.verify (statistical exactness is in test_verify_stats.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tlt.backends.base import SamplingParams
from tlt.speculative import verify as verify_mod
from tlt.speculative.sampling import probs_from_logits, sample_tokens
from tlt.speculative.tree import DraftTree
from tlt.speculative.verify import emitted_tokens, verify_chain_with_draft_probs, verify_tree

GREEDY = SamplingParams(temperature=0.0)
V = 6
# Toy target whose next-token logits depend on the last token only: NEXT[t] is the greedy successor of t.
NEXT = [1, 2, 3, 4, 5, 0]


def toy_table(sharp: float = 4.0) -> torch.Tensor:
    """[V, V] logits: row t peaks at NEXT[t], second best is NEXT[NEXT[t]]."""
    table = torch.zeros(V, V)
    for t in range(V):
        table[t, NEXT[t]] = sharp
        table[t, NEXT[NEXT[t]]] = sharp / 2
    return table


def node_logits(table: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """[B, N, V] target logits at each node: table[token of the node] (context = last token)."""
    return table[tree.tokens]


def tree_of(tokens: list[int], parents: list[int]) -> DraftTree:
    return DraftTree(tokens=torch.tensor([tokens]), parents=torch.tensor([parents]))


def test_greedy_always_accept() -> None:
    tree = DraftTree.chain(torch.tensor([[0, 1, 2, 3]]))
    result = verify_tree(tree, node_logits(toy_table(), tree), GREEDY, None)
    assert result.path.tolist() == [[0, 1, 2, 3]]
    assert result.num_accepted.tolist() == [3]
    assert result.bonus.tolist() == [4]
    tokens, counts = emitted_tokens(tree, result)
    assert tokens.tolist() == [[1, 2, 3, 4]] and counts.tolist() == [4]


def test_greedy_never_accept() -> None:
    tree = DraftTree.chain(torch.tensor([[0, 5, 0, 1]]))
    result = verify_tree(tree, node_logits(toy_table(), tree), GREEDY, None)
    assert result.path.tolist() == [[0, -1, -1, -1]]
    assert result.num_accepted.tolist() == [0]
    assert result.bonus.tolist() == [1]
    assert emitted_tokens(tree, result)[0].tolist() == [[1, -1, -1, -1]]


def test_greedy_accepts_first_two_of_four() -> None:
    tree = DraftTree.chain(torch.tensor([[0, 1, 2, 5, 0], [3, 4, 5, 1, 0]]))
    result = verify_tree(tree, node_logits(toy_table(), tree), GREEDY, None)
    assert result.path.tolist() == [[0, 1, 2, -1, -1], [0, 1, 2, -1, -1]]
    assert result.num_accepted.tolist() == [2, 2]
    assert result.bonus.tolist() == [3, 0]
    tokens, counts = emitted_tokens(tree, result)
    assert tokens.tolist() == [[1, 2, 3, -1, -1], [4, 5, 0, -1, -1]]
    assert counts.tolist() == [3, 3]


def test_greedy_second_child_is_right() -> None:
    # root 0 -> children (4, 1); 1 -> children (3, 2); 4 -> child 5.
    tree = tree_of([0, 4, 1, 3, 2, 5], [-1, 0, 0, 2, 2, 1])
    result = verify_tree(tree, node_logits(toy_table(), tree), GREEDY, None)
    assert result.path.tolist() == [[0, 2, 4]]
    assert result.num_accepted.tolist() == [2]
    assert result.bonus.tolist() == [3]


def test_greedy_duplicate_children_take_first() -> None:
    tree = tree_of([0, 1, 1, 2], [-1, 0, 0, 2])
    result = verify_tree(tree, node_logits(toy_table(), tree), GREEDY, None)
    assert result.path.tolist() == [[0, 1, -1]]
    assert result.bonus.tolist() == [2]


def test_greedy_ties_break_to_lowest_token() -> None:
    tree = tree_of([0, 3, 2], [-1, 0, 0])
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, [2, 3]] = 1.0  # tie between tokens 2 and 3: argmax picks 2
    result = verify_tree(tree, logits, GREEDY, None)
    assert result.path.tolist() == [[0, 2]]


def test_sampled_always_accept_when_target_is_one_hot() -> None:
    # top_k = 1 makes the sampled target deterministic, so every coin accepts the argmax chain.
    tree = DraftTree.chain(torch.tensor([[0, 1, 2, 3]]).repeat(50, 1))
    params = SamplingParams(temperature=0.7, top_k=1)
    result = verify_tree(tree, node_logits(toy_table(), tree), params, torch.Generator().manual_seed(0))
    assert torch.equal(result.num_accepted, torch.full((50,), 3))
    assert torch.equal(result.bonus, torch.full((50,), 4))


def test_sampled_never_accepts_filtered_tokens() -> None:
    # top_k = 2 keeps only NEXT[t] and NEXT[NEXT[t]]; the drafts 4 and 5 after root 0 have zero mass.
    tree = tree_of([0, 4, 5, 1], [-1, 0, 0, 1])
    tree = DraftTree(tokens=tree.tokens.repeat(200, 1), parents=tree.parents.repeat(200, 1))
    params = SamplingParams(temperature=1.0, top_k=2)
    result = verify_tree(tree, node_logits(toy_table(), tree), params, torch.Generator().manual_seed(1))
    assert torch.equal(result.num_accepted, torch.zeros(200, dtype=torch.long))
    assert set(result.bonus.tolist()) == {1, 2}


def test_sampled_duplicate_children_follow_the_coin() -> None:
    # p(. | root) = {3: 0.5, 5: 0.5}; children (3, 3, 5): u < 0.5 takes node 1, else node 3, never node 2.
    B = 400
    tree = tree_of([0, 3, 3, 5], [-1, 0, 0, 0])
    tree = DraftTree(tokens=tree.tokens.repeat(B, 1), parents=tree.parents.repeat(B, 1))
    logits = torch.full((B, 4, V), -1e9)
    logits[:, 0, 3] = logits[:, 0, 5] = 0.0
    logits[:, 1:, 0] = 0.0
    result = verify_tree(tree, logits, SamplingParams(), torch.Generator().manual_seed(3))
    coins = torch.rand(B, generator=torch.Generator().manual_seed(3))  # the level-1 coins, drawn first
    assert torch.equal(result.path[:, 1], torch.where(coins < 0.5, 1, 3))
    assert torch.equal(result.bonus, torch.zeros(B, dtype=torch.long))


def test_forced_accept_when_children_cover_the_support(monkeypatch: pytest.MonkeyPatch) -> None:
    # If float rounding made every coin miss while the children hold all of p, the last child is taken.
    monkeypatch.setattr(verify_mod, "_first_accepted", lambda cum, u: (torch.zeros_like(u).long(), u < 0))
    tokens = torch.tensor([[0, 1, 2, 0], [0, 1, 0, 0]])
    tree = DraftTree(tokens=tokens, parents=torch.tensor([[-1, 0, 0, 0]] * 2))
    logits = torch.full((2, 4, 3), -1e9)
    logits[:, 0, 1] = logits[:, 0, 2] = 0.0  # support {1, 2}
    result = verify_tree(tree, logits, SamplingParams(), torch.Generator().manual_seed(0))
    assert result.path.tolist() == [[0, 2], [0, -1]]  # row 0 covered by nodes 1, 2; row 1 has 2 left over
    assert result.bonus[1].item() == 2


def test_root_only_tree_is_plain_sampling() -> None:
    # With no drafts, verification is exactly one plain decoding step (same draws from the same generator).
    tree = DraftTree(tokens=torch.tensor([[0], [3], [5]]), parents=torch.full((3, 1), -1))
    logits = node_logits(toy_table(1.0), tree)
    params = SamplingParams(temperature=0.7, top_p=0.9)
    result = verify_tree(tree, logits, params, torch.Generator().manual_seed(4))
    plain = sample_tokens(probs_from_logits(logits[:, 0], params), torch.Generator().manual_seed(4))
    assert torch.equal(result.bonus, plain)
    assert result.path.tolist() == [[0], [0], [0]] and result.num_accepted.tolist() == [0, 0, 0]


def test_verify_tree_shape_error() -> None:
    tree = DraftTree.chain(torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match=r"target_logits must be \[B, N, V\]"):
        verify_tree(tree, torch.zeros(1, 2, V), GREEDY, None)


def test_chain_same_draft_and_target_always_accepts() -> None:
    B, K = 100, 3
    g = torch.Generator().manual_seed(0)
    target_logits = torch.randn(B, K + 1, V, generator=g)
    q = probs_from_logits(target_logits[:, :K], SamplingParams())
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    result = verify_chain_with_draft_probs(draft, q, target_logits, SamplingParams(), g)
    assert torch.equal(result.num_accepted, torch.full((B,), K))
    assert torch.equal(result.path, torch.arange(K + 1).expand(B, K + 1))


def test_chain_accepts_first_two_of_four_and_resamples_residual() -> None:
    B, K = 200, 4
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.0, 0.5, 0.5])
    target_logits = p.log().expand(B, K + 1, 3)
    draft_probs = torch.stack([p, p, q, q]).expand(B, K, 3)
    draft = torch.tensor([[1, 0, 2, 2]]).expand(B, K)  # p(x) = q(x) for the first two, p(2) = 0 after
    result = verify_chain_with_draft_probs(draft, draft_probs, target_logits, SamplingParams(), None)
    assert torch.equal(result.num_accepted, torch.full((B,), 2))
    assert torch.equal(result.path, torch.tensor([[0, 1, 2, -1, -1]]).expand(B, K + 1))
    assert torch.equal(result.bonus, torch.zeros(B, dtype=torch.long))  # norm(max(0, p - q)) = one-hot at 0
    tree = DraftTree.chain(torch.cat([torch.zeros(B, 1, dtype=torch.long), draft], dim=1))
    tokens, counts = emitted_tokens(tree, result)
    assert tokens[0].tolist() == [1, 0, 0, -1, -1] and counts[0].item() == 3


def test_chain_shape_error() -> None:
    with pytest.raises(ValueError, match="draft_probs"):
        verify_chain_with_draft_probs(
            torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, V), torch.zeros(1, 3, V), GREEDY, None
        )


# ---------------------------------------------------------------- property tests on random trees

SAMPLED_PARAMS = [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 0.8, 0), (1.0, 1.0, 3)]  # (temperature, top_p, top_k)


@st.composite
def random_trees(draw: st.DrawFn) -> tuple[DraftTree, torch.Tensor]:
    """(tree [B, N], table [V, V]) with random valid parents per row and tokens from a small vocabulary."""
    B, N = draw(st.integers(1, 4)), draw(st.integers(2, 9))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    parents = torch.full((B, N), -1, dtype=torch.long)
    for i in range(1, N):
        parents[:, i] = (torch.rand(B, generator=g) * i).long()  # uniform in [0, i)
    tokens = torch.randint(0, V, (B, N), generator=g)
    return DraftTree(tokens=tokens, parents=parents), torch.randn(V, V, generator=g) * 2


def naive_greedy(tree: DraftTree, logits: torch.Tensor, b: int) -> tuple[list[int], int]:
    """Reference walk in plain Python: (path, bonus) of row b."""
    tokens, parents = tree.tokens[b].tolist(), tree.parents[b].tolist()
    path, cur = [0], 0
    while True:
        best = int(logits[b, cur].argmax())
        hits = [j for j in range(len(tokens)) if parents[j] == cur and tokens[j] == best]
        if not hits:
            return path, best
        cur = hits[0]
        path.append(cur)


def check_path(tree: DraftTree, result) -> None:
    depth = int(tree.depths().max())
    assert result.path.shape == (tree.tokens.shape[0], depth + 1)
    for b in range(tree.tokens.shape[0]):
        n = int(result.num_accepted[b])
        path = result.path[b].tolist()
        assert 0 <= n <= depth and path[0] == 0 and path[n + 1 :] == [-1] * (depth - n)
        for k in range(1, n + 1):
            assert int(tree.parents[b, path[k]]) == path[k - 1]


@settings(max_examples=80, deadline=None)
@given(case=random_trees())
def test_greedy_matches_naive_reference_and_plain_decoding(case: tuple[DraftTree, torch.Tensor]) -> None:
    tree, table = case
    logits = node_logits(table, tree)
    result = verify_tree(tree, logits, GREEDY, None)
    check_path(tree, result)
    tokens, counts = emitted_tokens(tree, result)
    for b in range(tree.tokens.shape[0]):
        path, bonus = naive_greedy(tree, logits, b)
        n = len(path) - 1
        assert result.path[b, : n + 1].tolist() == path and int(result.bonus[b]) == bonus
        plain, last = [], int(tree.tokens[b, 0])
        for _ in range(n + 1):  # plain greedy decoding of the toy target from the root
            last = int(table[last].argmax())
            plain.append(last)
        assert int(counts[b]) == n + 1 and tokens[b, : n + 1].tolist() == plain


@settings(max_examples=80, deadline=None)
@given(
    case=random_trees(),
    params=st.sampled_from([SamplingParams(temperature=t, top_p=p, top_k=k) for t, p, k in SAMPLED_PARAMS]),
    seed=st.integers(0, 2**31 - 1),
)
def test_sampled_paths_are_valid_and_bonus_is_residual(
    case: tuple[DraftTree, torch.Tensor], params: SamplingParams, seed: int
) -> None:
    tree, table = case
    logits = node_logits(table, tree)
    result = verify_tree(tree, logits, params, torch.Generator().manual_seed(seed))
    check_path(tree, result)
    probs = probs_from_logits(logits, params)
    for b in range(tree.tokens.shape[0]):
        path = result.path[b, : int(result.num_accepted[b]) + 1].tolist()
        for parent, child in zip(path, path[1:], strict=False):
            assert probs[b, parent, tree.tokens[b, child]] > 0  # accepted tokens have target mass
        last, bonus = path[-1], int(result.bonus[b])
        children = [int(tree.tokens[b, j]) for j in range(tree.num_nodes) if int(tree.parents[b, j]) == last]
        assert probs[b, last, bonus] > 0 and bonus not in children


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), K=st.integers(1, 4), temperature=st.sampled_from([0.7, 1.0]))
def test_chain_bonus_is_possible_under_residual(seed: int, K: int, temperature: float) -> None:
    B = 8
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=temperature, top_k=4)
    target_logits = torch.randn(B, K + 1, V, generator=g) * 2
    q = torch.softmax(torch.randn(B, K, V, generator=g), dim=-1)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    result = verify_chain_with_draft_probs(draft, q, target_logits, params, g)
    p = probs_from_logits(target_logits, params)
    for b in range(B):
        n = int(result.num_accepted[b])
        assert result.path[b].tolist() == list(range(n + 1)) + [-1] * (K - n)
        assert all(p[b, i, draft[b, i]] > 0 for i in range(n))
        residual = p[b, n] - (q[b, n] if n < K else 0)
        assert residual[result.bonus[b]] > 0


def test_filler_past_a_rows_real_count_is_never_accepted() -> None:
    # row 0 drafts 1 -> 2 (real 3), then filler 3 that the target would accept; row 1 drafts nothing (real 1)
    tree = DraftTree.chain(torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]))
    tree.real = [3, 1]
    result = verify_tree(tree, node_logits(toy_table(), tree), GREEDY, None)
    assert result.num_accepted.tolist() == [2, 0]
    assert result.bonus.tolist() == [3, 1]  # the target's own next tokens, not the filler's


def test_filler_is_not_removed_from_the_bonus_distribution() -> None:
    # the root's only real child (token 5) has no target mass, so every coin rejects it; the filler child (token 1)
    # holds most of the mass: the bonus must still be drawn from p without token 5 only, filler included
    table = toy_table()
    tree = tree_of([0, 5, 1], [-1, 0, 0])
    tree.real = [2]
    params = SamplingParams(temperature=1.0)
    p = probs_from_logits(node_logits(table, tree), params)[0, 0]
    expected = p.masked_fill(torch.arange(V) == 5, 0.0)
    g = torch.Generator().manual_seed(0)
    draws = [int(verify_tree(tree, node_logits(table, tree), params, g).bonus) for _ in range(2000)]
    counts = torch.bincount(torch.tensor(draws), minlength=V).float() / len(draws)
    assert counts[1] > 0.5  # the filler's token stays in the residual (removing it would give 0)
    torch.testing.assert_close(counts, expected / expected.sum(), atol=0.04, rtol=0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), K=st.integers(1, 5), real=st.lists(st.integers(1, 6), min_size=3, max_size=3))
def test_chains_verified_at_once_match_the_walk(seed: int, K: int, real: list[int]) -> None:
    """Greedy: the chain path (all levels at once) accepts what the tree walk accepts, filler included."""
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.chain(torch.randint(0, V, (3, K + 1), generator=g))
    tree.real = [min(n, K + 1) for n in real]
    logits = node_logits(toy_table(), tree)
    chain = verify_tree(tree, logits, GREEDY, None)
    walk = verify_mod._verify_greedy(tree, logits, K)
    assert torch.equal(chain.path, walk.path) and torch.equal(chain.bonus, walk.bonus)


@pytest.mark.parametrize("real", [None, [3], [1]])
def test_sampled_chains_emit_the_targets_distribution(real) -> None:
    """The first token a chain's verification emits (its first draft if accepted, else the bonus) follows p at
    the root, and the second follows p after the first, whatever was drafted (x: 1 -> 3 -> 4)."""
    table = toy_table(sharp=1.5)
    tree = DraftTree.chain(torch.tensor([[0, 1, 3, 4]]))
    tree.real = real
    params = SamplingParams(temperature=1.0)
    p = probs_from_logits(table, params)  # [V, V]: p after token t
    g = torch.Generator().manual_seed(1)
    first, second = [], []
    for _ in range(3000):
        result = verify_tree(tree, node_logits(table, tree), params, g)
        tokens, _ = emitted_tokens(tree, result)
        first.append(int(tokens[0, 0]))
        if int(tokens[0, 0]) == 1 and result.num_accepted.item() >= 1:
            second.append(int(tokens[0, 1]))
    freq = torch.bincount(torch.tensor(first), minlength=V).float() / len(first)
    torch.testing.assert_close(freq, p[0], atol=0.03, rtol=0)
    if real != [1]:  # the first draft can be accepted: what follows it follows p after token 1
        freq = torch.bincount(torch.tensor(second), minlength=V).float() / len(second)
        torch.testing.assert_close(freq, p[1], atol=0.05, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    case=random_trees(),
    params=st.sampled_from([GREEDY, *(SamplingParams(temperature=t, top_p=p, top_k=k) for t, p, k in SAMPLED_PARAMS)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_walk_stopping_early_changes_nothing(
    case: tuple[DraftTree, torch.Tensor], params: SamplingParams, seed: int
) -> None:
    """On the CPU the level walk stops where no row goes on; walking every level gives the same path and bonus
    from the same generator (every level's coins are drawn before the walk)."""
    tree, table = case
    if tree.is_chain() and tree.num_nodes > 2:  # chains are verified all at once, with no walk
        tree.parents[:, -1] = 0
    logits = node_logits(table, tree)
    levels = tree.num_nodes - 1  # deeper than most trees: the engine passes its strategy's depth
    early = verify_tree(tree, logits, params, torch.Generator().manual_seed(seed), num_levels=levels)
    walk = verify_mod._walk_levels
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verify_mod, "_walk_levels", lambda *args: walk(*args, stop_early=False))
        full = verify_tree(tree, logits, params, torch.Generator().manual_seed(seed), num_levels=levels)
    assert torch.equal(early.path, full.path) and torch.equal(early.bonus, full.bonus)
    assert torch.equal(early.num_accepted, full.num_accepted)

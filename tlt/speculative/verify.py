"""Lossless verification of speculative drafts: pure functions, target logits in, accepted path and bonus out.

`verify_tree` needs only the target (target-only recursive rule, any draft tree, greedy or sampled);
`verify_chain_with_draft_probs` is the classic rule for chains drafted by *sampling* from a known q.
Both use `probs_from_logits`, the distribution plain decoding samples from, so SD and plain decoding agree.
Exact up to float32 rounding of the probabilities (coins are float32 uniforms in [0, 1)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tlt.speculative.sampling import SamplingParams, probs_from_logits, sample_tokens
from tlt.speculative.tree import DraftTree, VerifyResult


def _check_tree_inputs(tree: DraftTree, target_logits: torch.Tensor) -> None:
    B, N = tree.tokens.shape
    if tree.parents.shape != (B, N):
        raise ValueError(f"DraftTree.parents {tuple(tree.parents.shape)} must match tokens [B, N] = [{B}, {N}]")
    if target_logits.dim() != 3 or tuple(target_logits.shape[:2]) != (B, N):
        raise ValueError(
            f"target_logits must be [B, N, V] with [B, N] = [{B}, {N}] from the tree (one row of logits per "
            f"tree node, the target's prediction after that node), got {tuple(target_logits.shape)}"
        )


def _first_true(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N] bool -> (index of the first True [B] (0 if none), whether any is True [B])."""
    return mask.int().argmax(dim=1), mask.any(dim=1)


ChooseChild = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _walk_levels(
    num_levels: int, B: int, device: torch.device, choose: ChooseChild, stop_early: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk down from the root; `choose(level, cur [B], active [B]) -> (child [B], found [B])` picks each level
    (level 0 is the root's children).

    stop_early (default: on the CPU): stop at the first level where no row went on, which reading costs no host
    sync there; on an accelerator every one of `num_levels` is walked, so nothing waits for the device. The
    result is the same either way. Returns (path [B, K + 1], num_accepted [B], last node [B]).
    """
    if stop_early is None:
        stop_early = device.type == "cpu"
    cur = torch.zeros(B, dtype=torch.long, device=device)
    active = torch.ones(B, dtype=torch.bool, device=device)
    path = torch.full((B, num_levels + 1), -1, dtype=torch.long, device=device)
    path[:, 0] = 0
    for level in range(num_levels):
        child, found = choose(level, cur, active)
        found = found & active
        cur = torch.where(found, child, cur)
        path[:, level + 1] = torch.where(found, child, -1)
        active = found
        if stop_early and not active.any():
            break
    num_accepted = (path[:, 1:] >= 0).sum(dim=1)
    return path, num_accepted, cur


def _verify_greedy(tree: DraftTree, target_logits: torch.Tensor, num_levels: int) -> VerifyResult:
    best = target_logits.float().argmax(dim=-1)  # [B, N] target's greedy next token after each node
    matches = tree.tokens == best.gather(1, tree.parents.clamp(min=0))  # [B, N] node equals its parent's argmax
    matches[:, 0] = False
    real = tree.real_mask()
    if real is not None:
        matches &= real

    def choose(level: int, cur: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _first_true((tree.parents == cur[:, None]) & matches)

    path, num_accepted, last = _walk_levels(num_levels, tree.tokens.shape[0], tree.tokens.device, choose)
    return VerifyResult(path=path, num_accepted=num_accepted, bonus=best.gather(1, last[:, None]).squeeze(1))


def _repeats(tree: DraftTree) -> torch.Tensor:
    """[B, N] bool: the node repeats the token of an earlier sibling (such a child adds no mass of its own)."""
    N = tree.num_nodes
    earlier = torch.ones(N, N, dtype=torch.bool, device=tree.tokens.device).tril(diagonal=-1)  # [N, N] j < i
    same = (tree.tokens[:, :, None] == tree.tokens[:, None, :]) & (tree.parents[:, :, None] == tree.parents[:, None, :])
    return (same & earlier).any(dim=-1)


def _remove_children(p_cur: torch.Tensor, tokens: torch.Tensor, is_child: torch.Tensor) -> torch.Tensor:
    """[B, V] p_cur with the mass of every child's token set to 0 (not renormalised)."""
    covered = torch.zeros_like(p_cur).scatter_add(1, tokens, is_child.to(p_cur.dtype)) > 0  # [B, V]
    return p_cur.masked_fill(covered, 0.0)


def _first_accepted(cum: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Child k is taken when cum_{k-1} <= u < cum_k, so P = p(x_k) for u ~ U[0, 1): (child [B], found [B])."""
    return _first_true(cum > u[:, None])


def _verify_sampled(
    tree: DraftTree, probs: torch.Tensor, num_levels: int, generator: torch.Generator | None
) -> VerifyResult:
    B = probs.shape[0]
    rows = torch.arange(B, device=probs.device)
    node_ids = torch.arange(tree.num_nodes, device=probs.device)
    real = tree.real_mask()
    drafted = tree.parents >= 0 if real is None else real  # filler is no child: never tried, never removed
    counted = drafted & ~_repeats(tree)  # [B, N] children whose token carries mass
    token_probs = probs.gather(2, tree.tokens[:, None, :].expand(-1, probs.shape[1], -1))  # [B, N, N]: p_i(x_j)
    coins = torch.rand(B, num_levels, generator=generator, device=probs.device)  # one per row and level

    def choose(level: int, cur: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        is_child = (tree.parents == cur[:, None]) & active[:, None] & drafted  # [B, N]
        mass = token_probs[rows, cur] * (is_child & counted)  # [B, N]
        child, found = _first_accepted(mass.cumsum(dim=1), coins[:, level])
        # Children covering all of p make rejection impossible; a float-rounding miss takes the last one.
        no_rest = _remove_children(probs[rows, cur], tree.tokens, is_child).sum(dim=1) <= 0
        last = ((mass > 0) * node_ids).argmax(dim=1)
        forced = no_rest & ~found & (mass > 0).any(dim=1)
        return torch.where(forced, last, child), found | forced

    path, num_accepted, last = _walk_levels(num_levels, B, probs.device, choose)
    # The last node's children were all rejected (or it has none): the bonus is p there minus their tokens.
    residual = _remove_children(probs[rows, last], tree.tokens, (tree.parents == last[:, None]) & drafted)
    return VerifyResult(path=path, num_accepted=num_accepted, bonus=sample_tokens(residual, generator))


def verify_tree(
    tree: DraftTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    num_levels: int | None = None,
) -> VerifyResult:
    """Verify a batch of draft trees against the target; lossless for any tree.

    num_levels: how deep to walk, at least the trees' depth (the engine passes its strategy's, so no host sync
    reads the depth); None: the trees' depth.

    target_logits: [B, N, V], row i is the target's prediction after node i (context = root path to node i).
    Greedy: follow the first child equal to its parent's argmax; bonus = argmax at the last accepted node.
    Sampled (TLT / SGLang rule): per level one coin u; accept the first child k with u < sum_{j<=k} p(x_j)
    (repeated child tokens count once); if none, the bonus is drawn from p with the children's tokens removed.
    Nodes past a row's `tree.real` count are filler, no node's children: never accepted, never removed.

    Why exact: at a node with context c, child k is accepted with probability p(x_k | c); on rejection
    (prob 1 - sum_j p(x_j | c)) the bonus y is drawn from p(. | c) restricted to non-child tokens, so y is
    emitted with probability p(y | c). Hence the next emitted token is exactly p(. | c)-distributed whatever
    the children are. After accepting x_k we stand at context c + x_k with a fresh independent coin and a tree
    fixed before the coins were drawn, so by induction each emitted token follows the target given its prefix.
    """
    _check_tree_inputs(tree, target_logits)
    if num_levels is None:
        num_levels = int(tree.depths().max())
    if tree.is_chain():
        return _verify_chain(tree, target_logits, params, min(num_levels, tree.num_nodes - 1), generator)
    if params.greedy:
        return _verify_greedy(tree, target_logits, num_levels)
    return _verify_sampled(tree, probs_from_logits(target_logits, params), num_levels, generator)


def _verify_chain(
    tree: DraftTree, target_logits: torch.Tensor, params: SamplingParams, K: int, generator: torch.Generator | None
) -> VerifyResult:
    """The same rule on a chain (one child per node), every level at once instead of a walk: node i + 1 is
    accepted when the target's choice after node i is its token (greedy: the argmax; sampled: a coin u_i <
    p_i(x), so with probability p_i(x)), the first rejection ends the path, and the bonus is drawn after the
    last accepted node from p without the rejected token (all of p where nothing was tried there)."""
    B = tree.tokens.shape[0]
    drafted = tree.tokens[:, 1 : K + 1]  # [B, K]
    real = tree.real_mask()
    tried = torch.ones_like(drafted, dtype=torch.bool) if real is None else real[:, 1 : K + 1]
    rows = torch.arange(B, device=drafted.device)
    if params.greedy:
        best = target_logits[:, : K + 1].float().argmax(dim=-1)  # [B, K + 1]
        num_accepted = _accepted_prefix((drafted == best[:, :K]) & tried)
        bonus = best[rows, num_accepted]
    else:
        probs = probs_from_logits(target_logits[:, : K + 1], params)  # [B, K + 1, V]
        p_x = probs[:, :K].gather(-1, drafted[..., None]).squeeze(-1)  # [B, K]
        # p without x holding no mass (x is certain, up to rounding): rejection is impossible, take x
        certain = probs[:, :K].scatter(-1, drafted[..., None], 0.0).sum(dim=-1) <= 0
        u = torch.rand(B, K, generator=generator, device=probs.device)
        num_accepted = _accepted_prefix(((u < p_x) | certain) & tried)
        residual = probs[rows, num_accepted]  # [B, V]
        next_tried = torch.cat([tried, tried.new_zeros(B, 1)], dim=1)[rows, num_accepted]  # [B]
        rejected = torch.cat([drafted, tree.tokens[:, :1]], dim=1)[rows, num_accepted]  # [B], where next_tried
        removed = residual.scatter(1, rejected[:, None], 0.0)
        residual = torch.where(next_tried[:, None], removed, residual)
        bonus = sample_tokens(residual, generator)
    return VerifyResult(path=_chain_path(num_accepted, K), num_accepted=num_accepted, bonus=bonus)


def _accepted_prefix(accepts: torch.Tensor) -> torch.Tensor:
    """[B, K] bool, whether each chain node would be accepted -> [B] accepted draft tokens: up to the first not."""
    return accepts.long().cumprod(dim=1).sum(dim=1)


def _chain_path(num_accepted: torch.Tensor, K: int) -> torch.Tensor:
    """[B, K + 1] path of a chain: nodes 0..num_accepted, then -1."""
    steps = torch.arange(K + 1, device=num_accepted.device)
    return torch.where(steps <= num_accepted[:, None], steps, -1)


def _chain_accepts(u: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """[B, K] accept with probability min(1, p / q): u < p / q, written without a division."""
    return u * q_x < p_x


def verify_chain_with_draft_probs(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> VerifyResult:
    """Classic speculative sampling (Leviathan et al. 2023, arXiv 2211.17192) for a drafted chain.

    draft_tokens: [B, K], draft token i was sampled from draft_probs[:, i] ([B, K, V], the drafter's actual
    sampling distribution). target_logits: [B, K + 1, V], row i is the target's prediction before draft i
    (row K follows the last draft). Accept token i with min(1, p/q); at the first rejection resample from
    norm(max(0, p - q)); if all are accepted, the bonus comes from p at row K. Path indices refer to
    `DraftTree.chain(cat([root, draft_tokens], 1))`, so `emitted_tokens` applies to that tree.
    """
    B, K = draft_tokens.shape
    V = target_logits.shape[-1]
    if tuple(draft_probs.shape) != (B, K, V) or tuple(target_logits.shape) != (B, K + 1, V):
        raise ValueError(
            f"expected draft_probs [B, K, V] and target_logits [B, K + 1, V] for draft_tokens [B, K] = "
            f"{B, K}, "
            f"got {tuple(draft_probs.shape)} and {tuple(target_logits.shape)}"
        )
    p = probs_from_logits(target_logits, params)  # [B, K + 1, V]
    p_x = p[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    q_x = draft_probs.float().gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    u = torch.rand(B, K, generator=generator, device=p.device)
    num_accepted = _accepted_prefix(_chain_accepts(u, p_x, q_x))  # [B]
    rows = torch.arange(B, device=p.device)
    q_pad = torch.cat([draft_probs.float(), torch.zeros_like(p[:, :1])], dim=1)  # q = 0 after the last draft
    p_n, q_n = p[rows, num_accepted], q_pad[rows, num_accepted]  # [B, V]
    residual = (p_n - q_n).clamp(min=0)
    # p == q up to rounding makes rejection (almost) impossible; then any fallback is exact: use p.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_n)
    bonus = sample_tokens(residual, generator)
    return VerifyResult(path=_chain_path(num_accepted, K), num_accepted=num_accepted, bonus=bonus)


def emitted_tokens(tree: DraftTree, result: VerifyResult) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens one verification appends: (tokens [B, K + 1] -1 padded, counts [B] = num_accepted + 1).

    Row b is tree.tokens[b, path[b, 1 : 1 + num_accepted[b]]] followed by bonus[b].
    """
    B, width = result.path.shape
    steps = torch.arange(width, device=result.path.device)
    on_path = tree.tokens.gather(1, result.path.clamp(min=0))  # [B, K + 1], column j is the token of path[j]
    drafted = torch.cat([on_path[:, 1:], torch.full_like(on_path[:, :1], -1)], dim=1)
    n = result.num_accepted[:, None]
    tokens = torch.where(steps < n, drafted, -1)
    tokens = torch.where(steps == n, result.bonus[:, None], tokens)
    return tokens, result.num_accepted + 1

"""Statistical exactness of lossless verification: SD output has exactly the target's distribution.

Test: chi-square goodness of fit (scipy.stats.chisquare) of the joint distribution of the first TWO emitted
tokens against the target's exact joint p(y1 | root) p(y2 | y1), at alpha = 1e-3, with N_SAMPLES outcomes
drawn in one batched call; cells with expected count < 5 are pooled. Cells of probability 0 (filtered by
top-k / top-p) must have count 0 exactly. Power: every test first asserts that a 2% absolute shift of any
single cell (the rest rescaled) would be rejected with probability >= 0.9 (noncentral chi-square, see
`min_power`, itself checked by simulation below). With 20000 samples that holds only for few cells (a 2% shift
of a cell of mass 0.3 among 40 cells has power ~0.5), so N_SAMPLES = 40000. Negative controls: deliberately
lossy variants (0.5 acceptance slack; bonus from p without removing the rejected children) must be rejected by
the same test. The toy target is context dependent: logits = table[last token].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy import stats

from tlt.backends.base import SamplingParams
from tlt.speculative import verify as verify_mod
from tlt.speculative.sampling import probs_from_logits, sample_tokens
from tlt.speculative.tree import DraftTree
from tlt.speculative.verify import emitted_tokens, verify_chain_with_draft_probs, verify_tree

ALPHA = 1e-3
N_SAMPLES = 40000
SHIFT = 0.02  # absolute shift of one cell that the test must detect
MIN_POWER = 0.9
ROOT = 0

TREES = {  # parents lists, node 0 is the root
    "chain_3": [-1, 0, 1, 2],
    "top2_depth2": [-1, 0, 0, 1, 1, 2, 2],
    "top3_depth2": [-1, 0, 0, 0, 1, 1, 2, 3],
    "top2_depth3": [-1, 0, 0, 1, 1, 3, 4],
}
PARAMS = {
    "t0.7": SamplingParams(temperature=0.7),
    "t1.0": SamplingParams(temperature=1.0),
    "top_p0.8": SamplingParams(top_p=0.8),
    "top_k3": SamplingParams(top_k=3),
}
# roots [B] -> (emitted tokens [B, K + 1], counts [B]) of one SD iteration per row
EmitFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def target_table(V: int, seed: int) -> torch.Tensor:
    """[V, V] toy target logits: row t is the prediction after token t."""
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * 1.5


def exact_joint(table: torch.Tensor, params: SamplingParams) -> np.ndarray:
    """[V * V] float64 target probability of (y1, y2) after ROOT."""
    p = probs_from_logits(table, params).double()  # [V, V] p(y | t)
    return (p[ROOT][:, None] * p).flatten().numpy()


def pooled_cells(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool the cells with expected count < 5 into one (merged into the smallest other cell if still < 5)."""
    small = expected < 5
    obs, exp = list(observed[~small]), list(expected[~small])
    if small.any():
        pooled_obs, pooled_exp = observed[small].sum(), expected[small].sum()
        if pooled_exp < 5:
            i = int(np.argmin(exp))
            obs[i], exp[i] = obs[i] + pooled_obs, exp[i] + pooled_exp
        else:
            obs.append(pooled_obs)
            exp.append(pooled_exp)
    return np.asarray(obs, dtype=np.float64), np.asarray(exp, dtype=np.float64)


def min_power(probs: np.ndarray, n: int, shift: float = SHIFT, alpha: float = ALPHA) -> float:
    """Smallest power over cells i of the chi-square test against `probs` when cell i gains `shift` mass.

    The alternative moves `shift` into cell i and rescales the others; the statistic is then approximately
    noncentral chi-square with df = cells - 1 and lambda = n * sum((q - p)^2 / p).
    """
    df = len(probs) - 1
    critical = stats.chi2.isf(alpha, df)
    powers = []
    for i in range(len(probs)):
        q = probs * (1 - probs[i] - shift) / (1 - probs[i])
        q[i] = probs[i] + shift
        powers.append(stats.ncx2.sf(critical, df, n * ((q - probs) ** 2 / probs).sum()))
    return float(min(powers))


def first_two(emit: EmitFn, n: int) -> tuple[torch.Tensor, float]:
    """([n, 2] first two tokens after ROOT, fraction of rows whose first iteration accepted a draft).

    Rows that emitted a single token run a second SD iteration from it (so iterations compose, too).
    """
    tokens, counts = emit(torch.full((n,), ROOT))
    second_iteration = emit(tokens[:, 0])[0][:, 0]
    second = torch.where(counts >= 2, tokens[:, 1], second_iteration)
    return torch.stack([tokens[:, 0], second], dim=1), float((counts >= 2).double().mean())


def gof_pvalue(pairs: torch.Tensor, joint: np.ndarray) -> float:
    """Chi-square p-value of the observed pairs against `joint`, after the zero-cell and power checks."""
    V = int(round(len(joint) ** 0.5))
    n = pairs.shape[0]
    observed = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double().numpy()
    assert observed[joint == 0].sum() == 0, "a pair of target probability 0 was emitted"
    obs, exp = pooled_cells(observed[joint > 0], joint[joint > 0] * n)
    exp = exp * n / exp.sum()  # float32 probabilities sum to 1 only up to rounding
    assert min_power(exp / n, n) >= MIN_POWER, "too few samples to detect a 2% shift of one cell"
    return float(stats.chisquare(obs, exp).pvalue)


def tree_emitter(parents: list[int], table: torch.Tensor, params: SamplingParams, seed: int) -> EmitFn:
    """SD iterations with a fixed toy tree drafter: the tree for root r is drafts[r] (drawn once, offline)."""
    V, N = table.shape[0], len(parents)
    g = torch.Generator().manual_seed(seed)
    drafts = torch.zeros(V, N, dtype=torch.long)  # [V, N] tree tokens per root token
    drafts[:, 0] = torch.arange(V)
    noisy = table + torch.randn(V, V, generator=g)  # an imperfect drafter that often proposes duplicates
    for i in range(1, N):
        guess = noisy[drafts[:, parents[i]]]  # [V, V]
        first_child = parents.index(parents[i]) == i  # best guess first, as a top-k drafter orders them
        drafts[:, i] = guess.argmax(dim=-1) if first_child else sample_tokens(torch.softmax(guess, dim=-1), g)
    parent_rows = torch.tensor([parents])

    def emit(roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tree = DraftTree(tokens=drafts[roots], parents=parent_rows.expand(len(roots), N))
        return emitted_tokens(tree, verify_tree(tree, table[tree.tokens], params, g))

    return emit


def chain_emitter(K: int, table: torch.Tensor, params: SamplingParams, seed: int) -> EmitFn:
    """SD iterations with a toy sampling drafter q(. | last token) = softmax(draft_table[last])."""
    V = table.shape[0]
    g = torch.Generator().manual_seed(seed)
    q_table = torch.softmax(table + torch.randn(V, V, generator=g), dim=-1)  # [V, V]

    def emit(roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        context = [roots]
        for _ in range(K):
            context.append(sample_tokens(q_table[context[-1]], g))
        chain = torch.stack(context, dim=1)  # [B, K + 1] root then drafts
        result = verify_chain_with_draft_probs(chain[:, 1:], q_table[chain[:, :-1]], table[chain], params, g)
        return emitted_tokens(DraftTree.chain(chain), result)

    return emit


@pytest.mark.parametrize("params_name", list(PARAMS))
@pytest.mark.parametrize("tree_name", list(TREES))
def test_tree_verification_is_exact(tree_name: str, params_name: str) -> None:
    seed = list(TREES).index(tree_name) * 10 + list(PARAMS).index(params_name)
    V = 6 + seed % 3
    table, params = target_table(V, seed), PARAMS[params_name]
    pairs, accept_rate = first_two(tree_emitter(TREES[tree_name], table, params, seed), N_SAMPLES)
    assert accept_rate > 0.2  # the case exercises acceptance, not only the bonus
    assert gof_pvalue(pairs, exact_joint(table, params)) > ALPHA


@pytest.mark.parametrize("params_name", list(PARAMS))
def test_chain_with_draft_probs_is_exact(params_name: str) -> None:
    seed = 100 + list(PARAMS).index(params_name)
    V = 6 + seed % 3
    table, params = target_table(V, seed), PARAMS[params_name]
    pairs, accept_rate = first_two(chain_emitter(3, table, params, seed), N_SAMPLES)
    assert accept_rate > 0.2
    assert gof_pvalue(pairs, exact_joint(table, params)) > ALPHA


def slack_first_accepted(slack: float) -> Callable:
    """A lossy acceptance rule: child k is taken when u < sum_{j<=k} p(x_j) + slack."""

    def first_accepted(cum: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hit = (cum > 0) & (cum + slack > u[:, None])
        return hit.int().argmax(dim=1), hit.any(dim=1)

    return first_accepted


@pytest.mark.parametrize(
    ("name", "replacement"),
    [
        ("_first_accepted", slack_first_accepted(0.5)),
        ("_first_accepted", slack_first_accepted(0.02)),  # subtle: 0.02 slack
        ("_remove_children", lambda p_cur, tokens, is_child: p_cur),  # lossy: bonus from the full p
    ],
)
def test_negative_control_lossy_tree_rule_is_rejected(
    monkeypatch: pytest.MonkeyPatch, name: str, replacement: Callable
) -> None:
    monkeypatch.setattr(verify_mod, name, replacement)
    table, params = target_table(7, 1), PARAMS["t1.0"]
    pairs, _ = first_two(tree_emitter(TREES["top3_depth2"], table, params, 1), N_SAMPLES)
    assert gof_pvalue(pairs, exact_joint(table, params)) < ALPHA


def test_negative_control_lossy_chain_rule_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_mod, "_chain_accepts", lambda u, p_x, q_x: u * q_x < p_x + 0.5 * q_x)
    table, params = target_table(7, 2), PARAMS["t0.7"]
    pairs, _ = first_two(chain_emitter(3, table, params, 2), N_SAMPLES)
    assert gof_pvalue(pairs, exact_joint(table, params)) < ALPHA


def test_min_power_matches_simulated_rejection_rate() -> None:
    # Simulate the shifted alternative directly: the empirical rejection rate must match the computed power.
    probs = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.03])
    n, i, shift = 4000, 0, 0.03
    q = probs * (1 - probs[i] - shift) / (1 - probs[i])
    q[i] = probs[i] + shift
    samples = np.random.default_rng(0).multinomial(n, q, size=2000)  # [2000, cells]
    rejected = np.mean([stats.chisquare(s, probs * n).pvalue < ALPHA for s in samples])
    predicted = min_power(probs, n, shift=shift)
    assert predicted <= min_power(np.array([0.5, 0.5]), n, shift=shift)  # a 2-cell test is the most powerful
    assert abs(rejected - predicted) < 0.05

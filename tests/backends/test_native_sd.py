"""SD in NativeEngine is lossless: SD greedy == plain greedy for any drafter, tree or schedule."""

import random

import pytest
import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters.base import Drafter
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

GREEDY = SamplingParams(temperature=0, max_new_tokens=16)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [40]]
STRATEGIES = [SpecStrategy.parse(s) for s in ("1_1_2", "3_1_4", "2_2_5", "3_3_9")]


class ToyDrafter(Drafter):
    """Random trees whose nodes follow an oracle continuation with probability p_oracle (else random tokens).

    Also checks the Drafter state convention: it records every (prev_hidden, token) pair it is given.
    """

    kind = "toy"
    uses_target_hidden = True

    def __init__(self, truth: dict[tuple[int, ...], list[int]], p_oracle: float, seed: int = 0):
        self.truth, self.p_oracle, self.rng = truth, p_oracle, random.Random(seed)

    def bind(self, native_target):
        self.vocab = native_target.config.vocab_size

    def start(self, tokens, hidden, lengths):
        self.rows = [tokens[b, : lengths[b]].tolist() for b in range(tokens.shape[0])]
        self.prompts = [tuple(r) for r in self.rows]
        self.pairs = [[] for _ in self.rows]  # (hidden, token)

    def append(self, tokens, prev_hidden, counts):
        for b in range(tokens.shape[0]):
            for j in range(int(counts[b])):
                self.rows[b].append(int(tokens[b, j]))
                self.pairs[b].append((prev_hidden[b, j].clone(), int(tokens[b, j])))

    def keep(self, rows):
        self.rows = [self.rows[r] for r in rows.tolist()]
        self.prompts = [self.prompts[r] for r in rows.tolist()]
        self.pairs = [self.pairs[r] for r in rows.tolist()]

    def save(self, path):
        raise NotImplementedError

    def _true(self, b, depth):
        full = list(self.prompts[b]) + self.truth.get(self.prompts[b], [])
        index = len(self.rows[b]) + depth - 1
        return full[index] if index < len(full) else None

    def propose(self, strategy):
        tokens, parents = [], []
        for b in range(len(self.rows)):
            t, p = self._row_tree(b, strategy)
            tokens.append(t)
            parents.append(p)
        return DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))

    def _row_tree(self, b, strategy):
        tokens, parents, depth, on_truth, children = [self.rows[b][-1]], [-1], [0], [True], [0]
        for i in range(1, strategy.verify_tokens):
            open_nodes = [j for j in range(i) if depth[j] < strategy.steps and children[j] < strategy.topk]
            parent = open_nodes[0] if strategy.topk == 1 else self.rng.choice(open_nodes)
            true = self._true(b, depth[parent] + 1) if on_truth[parent] else None
            tok = true if true is not None and self.rng.random() < self.p_oracle else self.rng.randrange(self.vocab)
            tokens.append(tok)
            parents.append(parent)
            depth.append(depth[parent] + 1)
            on_truth.append(on_truth[parent] and tok == true)
            children[parent] += 1
            children.append(0)
        return tokens, parents


class SampledChainDrafter(ToyDrafter):
    """At temperature > 0, samples chains from q = 0.8 p^2 / sum(p^2) + 0.2 uniform, p the target's own
    distribution for the row's prefix and the drafts so far (a full HF forward per level), and returns q as
    draft_probs. q is sharper than p, so the rejection residual max(0, p - q) is far from p."""

    def bind(self, native_target):
        super().bind(native_target)
        self.model = native_target

    @torch.no_grad()
    def propose_sampled(self, strategy, sampling, generator):
        from tlt.speculative.sampling import probs_from_logits, sample_tokens

        depth = strategy.verify_tokens - 1
        drafts = [[] for _ in self.rows]
        probs = []
        for _ in range(depth):
            q = []
            for b, row in enumerate(self.rows):
                logits = self.model(torch.tensor([row + drafts[b]])).logits[0, -1]
                p = probs_from_logits(logits, sampling)
                q.append(0.8 * p**2 / (p**2).sum() + 0.2 / self.vocab)
            q = torch.stack(q)  # [B, V]
            for b, token in enumerate(sample_tokens(q, generator).tolist()):
                drafts[b].append(token)
            probs.append(q)
        tree = DraftTree.chain(torch.tensor([[row[-1]] + d for row, d in zip(self.rows, drafts, strict=True)]))
        tree.draft_probs = torch.stack(probs, dim=1)
        return tree


class CyclingTuner:
    """Cycles through arms every step (None = plain decoding)."""

    def __init__(self, arms):
        self.arms, self.step, self.updates = arms, 0, []

    def select(self, batch_size):
        arm = self.arms[self.step % len(self.arms)]
        self.step += 1
        return arm

    def update(self, strategy, batch_size, generated_tokens, seconds):
        self.updates.append((strategy, batch_size, generated_tokens))


@pytest.fixture(scope="module")
def plain(native_target):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64)
    return engine.generate(PROMPTS, GREEDY)


def _truth(plain):
    return {tuple(p): r.token_ids.tolist() for p, r in zip(PROMPTS, plain, strict=True)}


def _assert_same(sd, plain):
    for a, b in zip(sd, plain, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.finish_reason is b.finish_reason
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
@pytest.mark.parametrize("p_oracle", [1.0, 0.6, 0.0])
def test_sd_greedy_equals_plain(native_target, plain, strategy, p_oracle):
    drafter = ToyDrafter(_truth(plain), p_oracle, seed=1)
    tuner = CyclingTuner([strategy])
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64, tuner=tuner, drafter=drafter)
    _assert_same(engine.generate(PROMPTS, GREEDY), plain)
    stats = engine.step_stats
    assert all(s.sd_on and s.strategy == str(strategy) for s in stats)
    assert sum(s.generated_tokens for s in stats) == 4 * 16 - 4  # the first token comes from the prefill
    assert [u[2] for u in tuner.updates] == [s.generated_tokens for s in stats]
    accepted = sum(s.accepted_tokens for s in stats)
    if p_oracle == 1.0:
        assert len(stats) < 15  # perfect drafts: several tokens per step
    if p_oracle == 0.0:
        assert accepted <= 4  # random drafts over 64 tokens are rarely right


class RaggedDrafter(ToyDrafter):
    """Perfect trees of which only the first `real` nodes per row count as drafted (a model-free drafter's
    varying draft lengths); every third step no row drafts anything. The filler is right too, so a verifier
    that accepted filler would accept more than was drafted."""

    def propose(self, strategy):
        tree = super().propose(strategy)
        self.step = getattr(self, "step", -1) + 1
        N = strategy.verify_tokens
        tree.real = [1 if self.step % 3 == 2 else self.rng.randint(1, N) for _ in self.rows]
        return tree


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_ragged_drafts_verify_only_what_was_drafted(native_target, plain, strategy):
    tuner = CyclingTuner([strategy])
    drafter = RaggedDrafter(_truth(plain), 1.0, seed=3)
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64, tuner=tuner, drafter=drafter)
    lean, computed = engine.runner.lean, []
    forward = lean.forward

    def counting_forward(tokens, *args, select=None, **kwargs):
        computed.append((tokens.numel() if select is None else select.numel(), tokens.shape[1]))
        return forward(tokens, *args, select=select, **kwargs)

    lean.forward = counting_forward
    _assert_same(engine.generate(PROMPTS, GREEDY), plain)
    stats = engine.step_stats
    assert [u[0] for u in tuner.updates] == [strategy] * len(stats)  # the tuner learns its choice's yield
    assert any(not s.sd_on for s in stats) and any(s.accepted_tokens for s in stats)
    for s, (tokens, width) in zip(stats, computed[1:], strict=True):  # computed[0]: the prefill
        assert s.accepted_tokens <= s.drafted_tokens  # filler is never accepted
        if engine.runner.static is None:  # nor computed: the root and the drafted nodes only
            assert tokens == s.running_batch + s.drafted_tokens
        else:  # fixed shapes: a plain step or the strategy's full width
            assert width == (strategy.verify_tokens if s.sd_on else 1)


def test_switching_strategy_every_step(native_target, plain):
    drafter = ToyDrafter(_truth(plain), 0.7, seed=2)
    tuner = CyclingTuner([None, STRATEGIES[1], STRATEGIES[2]])
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64, tuner=tuner, drafter=drafter)
    _assert_same(engine.generate(PROMPTS, GREEDY), plain)
    assert [s.strategy for s in engine.step_stats[:3]] == [None, "3_1_4", "2_2_5"]


def test_eos_inside_accepted_tokens_and_max_new_tokens(native_target, plain):
    eos = plain[0].token_ids[3].item()
    short = SamplingParams(temperature=0, max_new_tokens=7)
    reference = NativeEngine(native_target, eos_token_id=eos, max_seq_len=64).generate(PROMPTS, short)
    drafter = ToyDrafter(_truth(plain), 1.0)
    engine = NativeEngine(
        native_target, eos_token_id=eos, max_seq_len=64, tuner=CyclingTuner([STRATEGIES[1]]), drafter=drafter
    )
    _assert_same(engine.generate(PROMPTS, short), reference)


def test_drafter_gets_hidden_of_the_producing_position(native_target, plain):
    drafter = ToyDrafter(_truth(plain), 0.7, seed=3)
    engine = NativeEngine(
        native_target,
        eos_token_id=None,
        max_seq_len=64,
        tuner=CyclingTuner([None, STRATEGIES[2]]),
        drafter=drafter,
    )
    engine.generate(PROMPTS[:1], GREEDY)
    pairs = drafter.pairs[0] if drafter.pairs else None
    seq = torch.tensor([PROMPTS[0] + plain[0].token_ids.tolist()])
    with torch.no_grad():
        hidden = native_target.model(seq).last_hidden_state[0]
    assert pairs is not None and [t for _, t in pairs] == plain[0].token_ids.tolist()
    for j, (h, _) in enumerate(pairs):
        torch.testing.assert_close(h, hidden[len(PROMPTS[0]) - 1 + j], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.1, max_new_tokens=3, seed=11),  # peaked enough for a few outcomes
        SamplingParams(temperature=0.2, top_k=4, top_p=0.9, max_new_tokens=3, seed=12),
        SamplingParams(temperature=1.0, top_k=3, max_new_tokens=3, seed=13),  # flat: rejections matter
    ],
    ids=["t0.1", "t0.2-topk4-topp0.9", "t1-topk3"],
)
@pytest.mark.parametrize("drafting", ["tree", "sampled_chain", "eagle_sampled_chain"])
def test_sd_sampling_matches_plain_first_tokens_distribution(native_target, params, drafting):
    """Chi-square homogeneity of the joint first three tokens (rare outcomes pooled), alpha = 0.001.

    tree: fixed 2_2_5 trees, target-only rule; sampled_chain: chains drawn from a known q, min(1, p / q) rule;
    eagle_sampled_chain: the EAGLE drafter's own sampled chains (int8 drafting, untrained head).
    """
    from scipy.stats import chi2_contingency

    from tlt.drafters.eagle import EagleDrafter

    prompt = [[7, 8]]
    plain_engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=16)
    greedy = plain_engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=3))[0].token_ids
    truth = {tuple(prompt[0]): greedy.tolist()}
    drafter, strategy = {
        "tree": (ToyDrafter(truth, 0.8, seed=5), STRATEGIES[2]),
        "sampled_chain": (SampledChainDrafter(truth, 0.8, seed=5), STRATEGIES[1]),
        "eagle_sampled_chain": (EagleDrafter.from_target(native_target, seed=1), STRATEGIES[1]),
    }[drafting]
    sd_engine = NativeEngine(
        native_target,
        eos_token_id=None,
        max_seq_len=16,
        tuner=CyclingTuner([strategy]),
        drafter=drafter,
        draft_int8=drafting == "eagle_sampled_chain",
    )
    counts = []
    for engine in (plain_engine, sd_engine):
        rollouts = engine.generate(prompt, params, n=1000 if drafting == "sampled_chain" else 400)
        counts.append([tuple(r.token_ids.tolist()) for r in rollouts])
    assert all(s.sd_on for s in sd_engine.step_stats)
    if drafting != "eagle_sampled_chain":  # an untrained head's drafts may all be rejected
        assert sum(s.accepted_tokens for s in sd_engine.step_stats) > 0
    keys = sorted({k for c in counts for k in c})
    table = [[c.count(k) for k in keys] for c in counts]
    common = [i for i in range(len(keys)) if table[0][i] + table[1][i] >= 10]
    rest = [sum(row[i] for i in range(len(keys)) if i not in common) for row in table]
    table = [[row[i] for i in common] + ([r] if sum(rest) else []) for row, r in zip(table, rest, strict=True)]
    assert len(table[0]) >= 5  # enough outcomes for the test to have power
    assert chi2_contingency(table).pvalue > 1e-3


def test_draft_probs_on_a_tree_are_rejected(native_target, plain):
    """min(1, p / q) verification is for chains: a tree carrying draft_probs is a drafter bug, not a draft."""

    class TreeWithProbs(ToyDrafter):
        def propose_sampled(self, strategy, sampling, generator):
            tree = self.propose(strategy)
            tree.draft_probs = torch.full((*tree.tokens.shape[:1], tree.num_nodes - 1, self.vocab), 1 / self.vocab)
            return tree

    drafter = TreeWithProbs(_truth(plain), 0.8)
    engine = NativeEngine(
        native_target, eos_token_id=None, max_seq_len=32, tuner=CyclingTuner([STRATEGIES[2]]), drafter=drafter
    )
    with pytest.raises(ValueError, match="sampled drafts must be a chain"):
        engine.generate(PROMPTS[:1], SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))


def test_fixed_tuner_turns_sd_on_in_the_long_tail(native_target, plain):
    from tlt.schedulers.tuners import FixedTuner

    eos = plain[2].token_ids[2].item()
    reference = NativeEngine(native_target, eos_token_id=eos, max_seq_len=64).generate(PROMPTS, GREEDY)
    lengths = sorted(len(r.token_ids) for r in reference)
    assert lengths[0] < lengths[-1]  # rows finish at different steps: a long tail
    engine = NativeEngine(
        native_target,
        eos_token_id=eos,
        max_seq_len=64,
        tuner=FixedTuner("3_1_4", threshold=2),
        drafter=ToyDrafter(_truth(plain), 0.8, seed=4),
    )
    _assert_same(engine.generate(PROMPTS, GREEDY), reference)
    assert all(s.sd_on == (s.running_batch <= 2) for s in engine.step_stats)
    assert any(s.sd_on for s in engine.step_stats)


def test_tree_near_the_context_limit_falls_back_to_plain(native_target):
    params = SamplingParams(temperature=0, max_new_tokens=32)
    reference = NativeEngine(native_target, eos_token_id=None, max_seq_len=14).generate(PROMPTS, params)
    truth = {tuple(p): r.token_ids.tolist() for p, r in zip(PROMPTS, reference, strict=True)}
    engine = NativeEngine(
        native_target,
        eos_token_id=None,
        max_seq_len=14,
        tuner=CyclingTuner([STRATEGIES[3]]),
        drafter=ToyDrafter(truth, 1.0),
    )
    _assert_same(engine.generate(PROMPTS, params), reference)
    assert engine.step_stats[0].sd_on and not engine.step_stats[-1].sd_on


def test_sd_returns_the_same_hidden_states_for_n_samples(native_target, plain):
    params = SamplingParams(temperature=0, max_new_tokens=10)
    reference = NativeEngine(native_target, eos_token_id=None, max_seq_len=64, return_hidden=True).generate(
        PROMPTS, params, n=2
    )
    engine = NativeEngine(
        native_target,
        eos_token_id=None,
        max_seq_len=64,
        return_hidden=True,
        tuner=CyclingTuner([STRATEGIES[2]]),
        drafter=ToyDrafter(_truth(plain), 0.8, seed=6),
    )
    rollouts = engine.generate(PROMPTS, params, n=2)
    _assert_same(rollouts, reference)
    for a, b in zip(rollouts, reference, strict=True):
        assert (a.prompt_index, a.sample_index) == (b.prompt_index, b.sample_index)
        torch.testing.assert_close(a.hidden_states, b.hidden_states, atol=1e-4, rtol=0)


def test_capabilities_and_drafter_binding(native_target, plain):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64)
    caps = engine.capabilities
    assert caps.per_step_strategy and caps.drafter_hot_swap and caps.hidden_states and caps.tree_drafts
    drafter = ToyDrafter(_truth(plain), 1.0)
    engine.set_drafter(drafter)
    assert drafter.vocab == 64 and engine.drafter is drafter
    engine.set_drafter(None)
    assert engine.drafter is None


def test_a_tree_of_the_wrong_size_is_rejected(native_target, plain):
    class ShortTrees(ToyDrafter):
        def propose(self, strategy):
            tree = super().propose(strategy)
            return DraftTree(tokens=tree.tokens[:, :-1], parents=tree.parents[:, :-1])

    engine = NativeEngine(
        native_target,
        eos_token_id=None,
        max_seq_len=64,
        tuner=CyclingTuner([STRATEGIES[1]]),
        drafter=ShortTrees(_truth(plain), 1.0),
    )
    with pytest.raises(ValueError, match=r"proposed a tree of shape \(4, 3\) for strategy 3_1_4"):
        engine.generate(PROMPTS, GREEDY)


@pytest.mark.parametrize("real", [[4, 4, 4], [4, 4, 4, 5], [0, 1, 2, 3]])
def test_draft_lengths_that_do_not_fit_the_tree_are_rejected(native_target, plain, real):
    class BadLengths(ToyDrafter):
        def propose(self, strategy):
            tree = super().propose(strategy)
            tree.real = real
            return tree

    engine = NativeEngine(
        native_target,
        eos_token_id=None,
        max_seq_len=64,
        tuner=CyclingTuner([STRATEGIES[1]]),
        drafter=BadLengths(_truth(plain), 1.0),
    )
    with pytest.raises(ValueError, match=r"expected one count per row in 1\.\.4"):
        engine.generate(PROMPTS, GREEDY)


@pytest.mark.parametrize("drafting", ["chain", "ragged_chain", "sampled_chain"])
def test_chains_verified_as_chains_match_the_tree_path(native_target, plain, drafting, monkeypatch):
    """A chain attends causally and is committed where it was written (no ancestor mask, no K/V moves): the same
    tokens and log-probs, from the same seed, as verifying it as a general tree, with drafts accepted."""
    import tlt.backends.native_runner as runner_module

    commits = []
    commit = runner_module.commit_path
    monkeypatch.setattr(runner_module, "commit_path", lambda *a: commits.append(1) or commit(*a))
    # the toys draft the greedy continuation, which sampling leaves at once; the sampled chain drafts from q ~ p
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=5) if drafting == "sampled_chain" else GREEDY
    strategy = SpecStrategy.parse("3_1_4")
    drafters = {"chain": ToyDrafter, "ragged_chain": RaggedDrafter, "sampled_chain": SampledChainDrafter}
    results = {}
    for shortcut in (True, False):
        drafter = drafters[drafting](_truth(plain), 1.0, seed=2)
        engine = NativeEngine(
            native_target, eos_token_id=None, max_seq_len=64, tuner=CyclingTuner([strategy]), drafter=drafter
        )
        engine.runner.chain_shortcut = shortcut
        commits.clear()
        results[shortcut] = engine.generate(PROMPTS, sampling)
        assert sum(s.accepted_tokens for s in engine.step_stats) > 0
        assert bool(commits) is not shortcut
    for a, b in zip(results[True], results[False], strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert torch.equal(a.logprobs, b.logprobs)

"""SmallLMDrafter: drafts equal a full-recompute reference, lossless SD, a target copy is always accepted."""

import copy
import json

import pytest
import torch

from tlt.drafters import load_drafter
from tlt.drafters.base import DrafterMismatchError
from tlt.drafters.small_lm import SmallLMDrafter
from tlt.models.presets import build_model
from tlt.speculative.strategy import SpecStrategy

from .engine_checks import STRATEGIES, assert_same, plain, ragged_eos, speculative

CHAINS = [SpecStrategy.parse(s) for s in ("1_1_2", "3_1_4", "5_1_6")]


@pytest.fixture(scope="module")
def draft_model():
    """A random drafter unrelated to the target (same vocabulary), with varied predictions."""
    model = build_model("test", vocab_size=64, seed=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15, generator=g)
    return model


def _reference_tree(model, history, strategy):
    """EAGLE-2 beam draft with one HF forward over the full sequence per expanded node: (tokens, parents)."""

    def logp(path):
        with torch.no_grad():
            return model(torch.tensor([history + path])).logits[0, -1].log_softmax(-1)

    K = strategy.topk
    scores, tokens = logp([]).topk(K)
    pairs = zip(scores.tolist(), tokens.tolist(), strict=True)
    cands = [(s, [t], -1) for s, t in pairs]  # (score, path, parent candidate)
    beam = list(range(K))
    for _ in range(1, strategy.steps):
        children = []
        for c in beam:
            score, path, _ = cands[c]
            child_scores, child_tokens = (score + logp(path)).topk(K)
            for s, t in zip(child_scores.tolist(), child_tokens.tolist(), strict=True):
                children.append(len(cands))
                cands.append((s, path + [t], c))
        beam = sorted(children, key=lambda c: -cands[c][0])[:K]
    keep = sorted(sorted(range(len(cands)), key=lambda c: -cands[c][0])[: strategy.num_draft_tokens])
    node = {c: i + 1 for i, c in enumerate(keep)}
    tokens = [history[-1]] + [cands[c][1][-1] for c in keep]
    parents = [-1] + [node.get(cands[c][2], 0) for c in keep]
    return tokens, parents


def _assert_reference(drafter, model, histories, strategy):
    tree = drafter.propose(strategy)
    for b, history in enumerate(histories):
        expected = _reference_tree(model, history, strategy)
        assert (tree.tokens[b].tolist(), tree.parents[b].tolist()) == expected


@pytest.mark.parametrize("strategy", ["1_1_2", "4_1_5", "2_2_5", "3_3_9", "3_2_6"])
def test_drafts_match_a_full_recompute_reference(draft_model, strategy):
    """Ragged prompts, ragged appends, a dropped row: the cache bookkeeping must stay exact throughout."""
    strategy = SpecStrategy.parse(strategy)
    histories = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [20, 21, 22]]
    drafter = SmallLMDrafter(copy.deepcopy(draft_model))
    prompts = torch.tensor([h + [0] * (7 - len(h)) for h in histories])
    drafter.start(prompts, None, torch.tensor([len(h) for h in histories]))
    drafter.append(torch.tensor([[30, 0, 0], [31, 0, 0], [32, 0, 0]]), None, torch.tensor([1, 1, 1]))
    histories = [h + [30 + b] for b, h in enumerate(histories)]
    _assert_reference(drafter, draft_model, histories, strategy)
    _assert_reference(drafter, draft_model, histories, strategy)  # propose is idempotent
    new = [[40, 41, 42], [43, 44, 45], [46, 47, 48]]
    drafter.append(torch.tensor(new), None, torch.tensor([3, 1, 2]))
    histories = [h + n[:c] for h, n, c in zip(histories, new, [3, 1, 2], strict=True)]
    _assert_reference(drafter, draft_model, histories, strategy)
    drafter.keep(torch.tensor([2, 0]))
    histories = [histories[2], histories[0]]
    drafter.append(torch.tensor([[50, 51], [52, 53]]), None, torch.tensor([2, 1]))
    histories = [histories[0] + [50, 51], histories[1] + [52]]
    _assert_reference(drafter, draft_model, histories, strategy)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
@pytest.mark.parametrize("drafter", ["copy", "random"])
def test_sd_greedy_equals_plain(native_target, draft_model, drafter, strategy):
    model = native_target if drafter == "copy" else draft_model
    sd, stats = speculative(native_target, SmallLMDrafter(copy.deepcopy(model)), strategy)
    assert_same(sd, plain(native_target))
    if drafter == "copy":  # the greedy first draft is the best-scored node, always in the tree
        assert all(s.accepted_tokens >= s.running_batch for s in stats)


@pytest.mark.parametrize("strategy", CHAINS, ids=str)
@pytest.mark.parametrize("eos", [False, True])
def test_a_copy_of_the_target_gets_every_chain_draft_accepted(native_target, strategy, eos):
    """Greedy drafts of the target itself are all accepted, also while rows leave the batch (eos)."""
    eos = ragged_eos(native_target) if eos else None
    drafter = SmallLMDrafter(copy.deepcopy(native_target))
    sd, stats = speculative(native_target, drafter, strategy, eos=eos)
    assert_same(sd, plain(native_target, eos=eos))
    assert all(s.accepted_tokens == s.running_batch * strategy.steps for s in stats)
    if eos is not None:
        assert len({s.running_batch for s in stats}) >= 2  # keep() dropped rows during SD


def test_vocab_mismatch_is_a_clear_error(native_target):
    drafter = SmallLMDrafter(build_model("test", vocab_size=80))
    with pytest.raises(DrafterMismatchError, match="vocab_size=80 but the target has vocab_size=64"):
        drafter.bind(native_target)


def test_save_load_round_trip(tmp_path, draft_model):
    drafter = SmallLMDrafter(copy.deepcopy(draft_model))
    drafter.save(tmp_path / "small")
    drafter.save(tmp_path / "small")  # overwriting an existing folder
    assert json.loads((tmp_path / "small" / "tlt_drafter.json").read_text()) == {"kind": "small_lm"}
    assert (tmp_path / "small" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]  # no temporary folders left
    strategy = SpecStrategy.parse("3_2_6")
    trees = []
    for d in (drafter, SmallLMDrafter.load(tmp_path / "small"), load_drafter(tmp_path / "small")):
        assert isinstance(d, SmallLMDrafter)
        d.start(torch.tensor([[3, 4, 5, 6]]), None, torch.tensor([4]))
        trees.append(d.propose(strategy))
    for tree in trees[1:]:
        assert torch.equal(tree.tokens, trees[0].tokens) and torch.equal(tree.parents, trees[0].parents)


def test_load_rejects_another_kind(tmp_path):
    from tlt.drafters.ngram import NgramDrafter

    NgramDrafter().save(tmp_path / "ngram")
    with pytest.raises(ValueError, match="holds a 'ngram' drafter, not 'small_lm'"):
        SmallLMDrafter.load(tmp_path / "ngram")

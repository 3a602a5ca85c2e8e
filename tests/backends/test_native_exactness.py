"""Exactness of speculative decoding through the native engine, for every drafter kind and both verification rules.

Test (as tests/speculative/test_verify_stats.py, whose helpers it reuses): a chi-square goodness of fit at
alpha = 1e-3 of the joint distribution of the two tokens after the prefill's first token, (y2, y3), which
the engine emits from SD steps, marginalised over y1, against the target's exact joint computed from the
model itself (sum over y1 of p(y1) p(y2 | y1) p(y3 | y1, y2)). The sample size is the smallest of
SAMPLE_SIZES with power >= 0.9 against a 2% absolute shift of any one cell (noncentral chi-square,
`min_power`), asserted. Every case asserts that drafts were accepted, so it never compares plain decoding
with plain decoding. Negative controls inject into the engine a verification that reads the target at 0.9 of
its temperature, in the target-only rule (`verify_tree`: trees and deterministic drafters) and in the
sampled-chain rule (`verify_chain_with_draft_probs`), and each must be rejected for every drafter kind that
uses that rule.

The target is a one-layer Qwen2 with an 8-token vocabulary, so the SD steps of 40,000 rows take seconds;
the EAGLE head is distilled for a few seconds on the target's greedy answers, the small LM and the n-gram
drafter are as they come (at V = 8 their proposals overlap the target's distribution often enough), and the
suffix drafter drafts from the other rows of the prompt (and from the earlier chunks' rows).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.speculative.test_verify_stats import ALPHA, MIN_POWER, min_power, pooled_cells
from tlt.backends import native_runner
from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.config import DrafterConfig
from tlt.drafters.composed import ComposedDrafter
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.ngram import NgramDrafter
from tlt.drafters.small_lm import SmallLMDrafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.schedulers.tuners import FixedTuner
from tlt.speculative.sampling import probs_from_logits
from tlt.training.drafter.distill import distill_drafter

V = 8
PROMPT = [1, 2, 3, 1, 2]  # repeats, so the n-gram drafter finds matches
SAMPLE_SIZES = (20000, 40000, 80000)
CHUNK = 20000  # rows per generate() call
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=3)

# drafter kind -> (drafter factory, SD strategy, verification rule the engine applies at T > 0)
CASES = {
    "eagle_chain": (lambda m: _distilled_eagle(m).clone(), "3_1_4", "chain"),
    "eagle_tree": (lambda m: _distilled_eagle(m).clone(), "2_2_5", "tree"),
    "small_lm": (lambda m: SmallLMDrafter(_model(seed=2)), "3_1_4", "tree"),
    "ngram": (lambda m: NgramDrafter(3, 1), "3_1_4", "tree"),
    "suffix": (lambda m: SuffixDrafter(), "3_1_4", "tree"),  # drafts from the other rows of the same prompt
    # several continuations per node, as many nodes as the history holds (filler past them, under the root)
    "suffix_tree": (lambda m: SuffixDrafter(spec_factor=8.0, min_token_prob=0.0), "2_3_8", "tree"),
    # EAGLE's sampled chains on some rows, suffix chains (q one-hot) on others, in one verify
    "composed": (lambda m: _trusting_composed(m), "3_1_4", "chain"),
}


@functools.cache
def _distilled_eagle(model) -> EagleDrafter:
    """An EAGLE head distilled for a few seconds on the target's own greedy answers (accepted where an
    untrained one is not)."""
    cfg = DrafterConfig(train_steps=80, batch_tokens=256, distill_max_new_tokens=24, eval_prompts=2, lr=3e-3)
    prompts = [[a, b, c] for a in range(V) for b in range(0, V, 3) for c in range(1, V, 2)]
    drafter, _ = distill_drafter(model, prompts, prompts[:2], cfg, None, None, seed=0, progress=False)
    return drafter


def _trusting_composed(model) -> ComposedDrafter:
    """EAGLE + suffix with a record that trusts every suffix draft far beyond EAGLE (as one kept from a run on
    repeated text could): rows with a suffix draft take it, the others EAGLE's sampled chain. With an empty record
    the suffix drafts here, 1-3 tokens seen once or after 2-token matches, lose to EAGLE on every row."""
    drafter = ComposedDrafter(_distilled_eagle(model).clone(), SuffixDrafter())
    drafter.record.suffix_sums = [[1e9, 0.0] for _ in drafter.record.suffix_sums]
    return drafter


def _model(seed: int = 0) -> Qwen2ForCausalLM:
    """A one-layer, 8-token Qwen2 whose next-token distributions are neither flat nor one-hot."""
    config = Qwen2Config(
        vocab_size=V,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.6, generator=torch.Generator().manual_seed(seed))
    return model


@pytest.fixture(scope="module")
def target() -> Qwen2ForCausalLM:
    torch.set_num_threads(1)
    return _model()


@torch.no_grad()
def exact_joint(model, params: SamplingParams) -> np.ndarray:
    """[V * V] float64: the target's probability of (y2, y3) after PROMPT, marginalised over y1."""
    first = probs_from_logits(model(torch.tensor([PROMPT])).logits[0, -1], params).double()  # [V] y1
    y1 = torch.arange(V)
    ids = torch.cat([torch.tensor(PROMPT).expand(V, -1), y1[:, None]], dim=1)  # [V, P + 1]
    second = probs_from_logits(model(ids).logits[:, -1], params).double()  # [V, V] p(y2 | y1)
    ids2 = torch.cat([ids.repeat_interleave(V, 0), y1.repeat(V)[:, None]], dim=1)  # [V * V, P + 2] (y1, y2)
    third = probs_from_logits(model(ids2).logits[:, -1], params).double().view(V, V, V)  # p(y3 | y1, y2)
    joint = (first[:, None, None] * second[:, :, None] * third).sum(0)  # [V, V] over (y2, y3)
    return joint.flatten().numpy()


def sample_size(joint: np.ndarray) -> int:
    for n in SAMPLE_SIZES:
        observed, expected = pooled_cells(joint * n, joint * n)
        if min_power(expected / n, n) >= MIN_POWER:
            return n
    raise AssertionError(f"no sample size in {SAMPLE_SIZES} reaches power {MIN_POWER} for a 2% shift")


def sd_pairs(target, case: str, n: int, seed: int) -> tuple[torch.Tensor, int, int]:
    """([n, 2] (y2, y3) of n SD rollouts of PROMPT, accepted draft tokens, SD steps) through NativeEngine; a
    composed drafter must have drafted rows from both its parts."""
    make, strategy, _ = CASES[case]
    engine = NativeEngine(target, None, 16, tuner=FixedTuner(strategy, threshold=10**6), drafter=make(target))
    pairs, accepted, sd_steps = [], 0, 0
    for start in range(0, n, CHUNK):
        params = dataclasses.replace(SAMPLING, seed=seed + start)
        rollouts = engine.generate([PROMPT], params, n=min(CHUNK, n - start))
        pairs.append(torch.stack([r.token_ids[1:3] for r in rollouts]))
        accepted += sum(s.accepted_tokens for s in engine.step_stats if s.sd_on)
        sd_steps += sum(1 for s in engine.step_stats if s.sd_on)
    if case == "composed":
        counts = engine.drafter.attribution()
        assert counts["learned"]["verifies"] > 0 and counts["suffix"]["verifies"] > 0, counts
    return torch.cat(pairs), accepted, sd_steps


def pvalue(pairs: torch.Tensor, joint: np.ndarray) -> float:
    n = pairs.shape[0]
    observed = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double().numpy()
    assert observed[joint == 0].sum() == 0, "a pair of target probability 0 was emitted"
    obs, exp = pooled_cells(observed, joint * n)
    return float(stats.chisquare(obs, exp * n / exp.sum()).pvalue)


def _biased(rule):
    """`rule` (a verification function) reading the target at 0.9 of the step's temperature."""

    def biased(*args, **kwargs):
        *head, sampling, generator = args
        return rule(*head, dataclasses.replace(sampling, temperature=0.9 * sampling.temperature), generator, **kwargs)

    return biased


@pytest.mark.parametrize("case", list(CASES))
def test_sd_through_the_engine_samples_the_targets_distribution(target, case):
    joint = exact_joint(target, SAMPLING)
    n = sample_size(joint)
    pairs, accepted, sd_steps = sd_pairs(target, case, n, seed=7)
    assert sd_steps >= n // CHUNK and accepted > 0.05 * n  # SD ran, and drafts were accepted
    assert pvalue(pairs, joint) > ALPHA


@pytest.mark.parametrize("case", list(CASES))
def test_a_biased_verification_inside_the_engine_is_caught(target, case, monkeypatch):
    """Negative control: 0.9 of the temperature in the rule this drafter's steps use must be rejected."""
    rule = CASES[case][2]
    name = "verify_chain_with_draft_probs" if rule == "chain" else "verify_tree"
    monkeypatch.setattr(native_runner, name, _biased(getattr(native_runner, name)))
    joint = exact_joint(target, SAMPLING)
    pairs, accepted, _ = sd_pairs(target, case, sample_size(joint), seed=7)
    assert accepted > 0 and pvalue(pairs, joint) < ALPHA


def _hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_sd_equals_transformers_generate(target, case):
    """Greedy SD through the engine, token for token against `transformers` generate (not only against the
    engine's own plain decoding), with drafts accepted."""
    make, strategy, _ = CASES[case]
    prompts = [PROMPT, [4, 5], [6, 0, 6, 0, 6], [7]]
    engine = NativeEngine(target, None, 40, tuner=FixedTuner(strategy, threshold=64), drafter=make(target))
    rollouts = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=24))
    assert sum(s.accepted_tokens for s in engine.step_stats) > 0
    for prompt, rollout in zip(prompts, rollouts, strict=True):
        assert rollout.token_ids.tolist() == _hf_greedy(target, prompt, 24)

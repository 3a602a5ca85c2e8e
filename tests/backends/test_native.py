"""NativeEngine plain decoding equals HF generate; stop rules, grouping, prompt limits, weights, hidden."""

import pytest
import torch

from tlt.backends.base import FinishReason, SamplingParams
from tlt.backends.native import NativeEngine

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [40]]


def _hf_greedy(model, prompt, max_new, eos=None):
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS])
def test_greedy_equals_hf_generate(native_target, prompts):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64)
    rollouts = engine.generate(prompts, GREEDY)
    assert [r.prompt_index for r in rollouts] == list(range(len(prompts)))
    for prompt, rollout in zip(prompts, rollouts, strict=True):
        assert rollout.token_ids.tolist() == _hf_greedy(native_target, prompt, 12)
        assert rollout.finish_reason is FinishReason.LENGTH
        assert rollout.prompt_ids.tolist() == prompt
    assert len(engine.step_stats) == 11 and engine.step_stats[0].running_batch == len(prompts)
    assert not any(s.sd_on for s in engine.step_stats)


def test_logprobs_and_hidden_states_match_hf(native_target):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64, return_hidden=True)
    params = SamplingParams(temperature=0.7, max_new_tokens=6, seed=3)
    for prompt, rollout in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        seq = torch.tensor([prompt + rollout.token_ids.tolist()])
        with torch.no_grad():
            out = native_target(seq, output_hidden_states=True)
        P = len(prompt)
        logp = torch.log_softmax(out.logits[0, P - 1 : -1] / 0.7, dim=-1)
        expected = logp.gather(1, rollout.token_ids[:, None]).squeeze(1)
        torch.testing.assert_close(rollout.logprobs, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(rollout.hidden_states, out.hidden_states[-1][0, P - 1 : -1], atol=1e-4, rtol=0)
        torch.testing.assert_close(rollout.prompt_hidden_states, out.hidden_states[-1][0, :P], atol=1e-4, rtol=0)
    samples = NativeEngine(native_target, eos_token_id=None, max_seq_len=64).generate(PROMPTS, params, n=2)
    assert all(r.hidden_states is None and r.prompt_hidden_states is None for r in samples)  # only if asked


def test_eos_stops_and_is_included(native_target):
    plain = NativeEngine(native_target, eos_token_id=None, max_seq_len=64).generate(PROMPTS, GREEDY)
    eos = plain[1].token_ids[4].item()
    first = plain[1].token_ids.tolist().index(eos)
    rollouts = NativeEngine(native_target, eos_token_id=eos, max_seq_len=64).generate(PROMPTS, GREEDY)
    assert rollouts[1].token_ids.tolist() == plain[1].token_ids[: first + 1].tolist()
    assert rollouts[1].finish_reason is FinishReason.STOP
    for plain_r, r in zip(plain, rollouts, strict=True):
        if eos not in plain_r.token_ids.tolist():
            assert r.finish_reason is FinishReason.LENGTH and torch.equal(r.token_ids, plain_r.token_ids)
        else:
            assert r.token_ids[-1].item() == eos and r.finish_reason is FinishReason.STOP


def test_context_limit_is_a_length_finish(native_target):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=8)
    rollouts = engine.generate(PROMPTS, GREEDY)
    assert [len(r.token_ids) for r in rollouts] == [3, 6, 5, 7]
    assert all(r.finish_reason is FinishReason.LENGTH for r in rollouts)
    assert rollouts[1].token_ids.tolist() == _hf_greedy(native_target, PROMPTS[1], 6)


def test_n_samples_are_grouped_and_seeded(native_target):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=64)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    rollouts = engine.generate(PROMPTS[:2], params, n=3)
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [(p, s) for p in range(2) for s in range(3)]
    assert len({tuple(r.token_ids.tolist()) for r in rollouts[:3]}) > 1  # samples differ
    again = engine.generate(PROMPTS[:2], params, n=3)
    assert all(torch.equal(a.token_ids, b.token_ids) for a, b in zip(rollouts, again, strict=True))
    greedy = engine.generate(PROMPTS[:2], GREEDY, n=2)
    assert torch.equal(greedy[0].token_ids, greedy[1].token_ids)
    assert greedy[2].token_ids.tolist() == _hf_greedy(native_target, PROMPTS[1], 12)


def test_prompt_limits(native_target):
    engine = NativeEngine(native_target, eos_token_id=None, max_seq_len=8)
    assert engine.generate([], GREEDY) == []
    with pytest.raises(ValueError, match=r"prompt 1 has 9 tokens, more than the engine limit of 7"):
        engine.generate([[3], list(range(3, 12))], GREEDY)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([[]], GREEDY)
    left = NativeEngine(native_target, eos_token_id=None, max_seq_len=8, truncate_prompts="left")
    four = SamplingParams(temperature=0, max_new_tokens=4)
    (rollout,) = left.generate([list(range(3, 12))], four)  # room for all 4 new tokens (before: 7 kept, 1 new)
    assert rollout.prompt_ids.tolist() == list(range(8, 12)) and len(rollout.token_ids) == 4
    (short,) = left.generate([[3, 4]], four)  # a prompt that leaves room is kept whole
    assert short.prompt_ids.tolist() == [3, 4] and len(short.token_ids) == 4
    with pytest.raises(ValueError, match="max_new_tokens=12 leaves no room for it in max_seq_len=8"):
        left.generate([list(range(3, 12))], GREEDY)
    with pytest.raises(ValueError, match="truncate_prompts"):
        NativeEngine(native_target, eos_token_id=None, max_seq_len=8, truncate_prompts="right")


def test_update_weights_changes_outputs_and_checks_shapes(native_target):
    import copy

    model = copy.deepcopy(native_target)
    engine = NativeEngine(model, eos_token_id=None, max_seq_len=64)
    before = engine.generate(PROMPTS, GREEDY)
    name = "model.layers.0.mlp.down_proj.weight"
    original = model.state_dict()[name].clone()
    with pytest.raises(ValueError, match="shape mismatch, nothing was loaded"):
        engine.update_weights({"model.norm.weight": torch.ones(128), name: torch.zeros(3, 3)})
    assert torch.equal(model.state_dict()["model.norm.weight"], native_target.state_dict()["model.norm.weight"])
    with pytest.raises(KeyError, match="unknown parameter names"):
        engine.update_weights({"model.layers.9.bogus": torch.zeros(1)})
    engine.update_weights({name: original * 3, "model.norm.weight": torch.full((128,), 2.0)}, version=5)
    assert engine.weights_version == 5
    after = engine.generate(PROMPTS, GREEDY)
    assert any(not torch.equal(a.token_ids, b.token_ids) for a, b in zip(before, after, strict=True))
    for prompt, rollout in zip(PROMPTS, after, strict=True):
        assert rollout.token_ids.tolist() == _hf_greedy(model, prompt, 12)

"""Shared engine checks for drafter tests: plain vs SD greedy runs through NativeEngine."""

import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.speculative.strategy import SpecStrategy

GREEDY = SamplingParams(temperature=0, max_new_tokens=16)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [10, 11], [12, 13, 14, 12, 13], [40]]
STRATEGIES = [SpecStrategy.parse(s) for s in ("1_1_2", "3_1_4", "2_2_5", "3_3_9")]


class AlwaysTuner:
    """Returns the same strategy every step and records the updates."""

    def __init__(self, strategy):
        self.strategy, self.updates = strategy, []

    def select(self, batch_size):
        return self.strategy

    def update(self, strategy, batch_size, generated_tokens, seconds):
        self.updates.append((strategy, batch_size, generated_tokens))


def plain(target, params=GREEDY, eos=None, prompts=PROMPTS):
    return NativeEngine(target, eos_token_id=eos, max_seq_len=64).generate(prompts, params)


def speculative(target, drafter, strategy, params=GREEDY, eos=None, prompts=PROMPTS):
    """(rollouts, step stats) of an SD run that uses `strategy` on every step (a step where a model-free
    drafter drafted nothing for any row runs plain)."""
    tuner = AlwaysTuner(strategy)
    engine = NativeEngine(target, eos_token_id=eos, max_seq_len=64, tuner=tuner, drafter=drafter)
    rollouts = engine.generate(prompts, params)
    assert all(s.strategy == str(strategy) or s.drafted_tokens == 0 for s in engine.step_stats)
    assert [u[0] for u in tuner.updates] == [strategy] * len(engine.step_stats)
    return rollouts, engine.step_stats


def assert_same(sd, reference):
    for a, b in zip(sd, reference, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.finish_reason is b.finish_reason
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def ragged_eos(target):
    """An EOS id that makes the PROMPTS rows finish at three or more different steps (a long tail)."""
    reference = plain(target)
    for token in sorted({t for r in reference for t in r.token_ids.tolist()}):
        if len({len(r.token_ids) for r in plain(target, eos=token)}) >= 3:
            return token
    raise AssertionError("no EOS id gives rows of different lengths")

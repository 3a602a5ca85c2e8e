"""Every registered tuner driving a real drafter through the engine keeps greedy output identical to plain
decoding; `off` never speculates, and the learning tuners do speculate in the long tail."""

import pytest

from tests.drafters.engine_checks import GREEDY, PROMPTS, assert_same, plain, ragged_eos
from tlt.backends.native import NativeEngine
from tlt.drafters.ngram import NgramDrafter
from tlt.schedulers.tuners.registry import build_tuner

STRATEGIES = ["2_1_3", "3_1_4", "2_2_5"]


@pytest.mark.parametrize("kind", ["off", "fixed", "beg", "ucb1", "cost"])
def test_every_tuner_keeps_greedy_output_identical(looping_target, kind):
    eos = ragged_eos(looping_target)
    reference = plain(looping_target, eos=eos)
    strategies = STRATEGIES[:1] if kind == "fixed" else STRATEGIES
    tuner = build_tuner(kind, strategies, seed=0)
    engine = NativeEngine(looping_target, eos_token_id=eos, max_seq_len=64, tuner=tuner, drafter=NgramDrafter())
    assert_same(engine.generate(PROMPTS, GREEDY), reference)
    sd_steps = [s for s in engine.step_stats if s.sd_on]
    if kind == "off":
        assert not sd_steps
    else:
        assert sd_steps and {s.strategy for s in sd_steps} <= set(strategies)

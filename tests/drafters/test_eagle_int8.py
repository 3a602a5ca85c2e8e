"""int8 drafting: an int8 copy of the EAGLE head drafts, the float head trains and saves; output unchanged."""

import copy

import pytest
import torch

from tests.drafters.test_eagle import GREEDY, PROMPTS, Cycling, _assert_same, _sequences, _sharp
from tlt.backends.native import NativeEngine
from tlt.config import ConfigError, load_config
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.ngram import NgramDrafter
from tlt.speculative.strategy import SpecStrategy

STRATEGIES = [SpecStrategy.parse(s) for s in ("3_1_4", "7_1_8", "2_2_5")]


@pytest.fixture(scope="module")
def target():
    from tests.tiny_model import random_target

    return random_target(0.15)


@pytest.fixture(scope="module")
def plain(target):
    return NativeEngine(target, eos_token_id=None, max_seq_len=64).generate(PROMPTS, GREEDY, n=2)


def _linear_kinds(head) -> set[str]:
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    kinds = {Int8Linear: "int8", torch.nn.Linear: "float"}
    return {kinds[type(m)] for m in head.modules() if type(m) in kinds}


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_int8_drafting_keeps_greedy_output_and_logprobs(target, plain, strategy):
    drafter = _sharp(target, 3)
    engine = NativeEngine(
        target, eos_token_id=None, max_seq_len=64, tuner=Cycling([strategy, None]), drafter=drafter, draft_int8=True
    )
    assert drafter.int8 and drafter.drafting_head is not drafter.head
    assert _linear_kinds(drafter.drafting_head.layers) == {"int8"}
    assert _linear_kinds(drafter.drafting_head.fc) == {"float"}  # [embedding; feature] input: kept float
    assert _linear_kinds(drafter.head) == {"float"}  # the trainable head stays float
    _assert_same(engine.generate(PROMPTS, GREEDY, n=2), plain)
    assert any(s.sd_on for s in engine.step_stats)


def test_int8_head_predicts_nearly_the_float_features(target):
    """Quantization noise, not a different function: features within a few percent, top-1 tokens mostly equal."""
    tokens, hidden = _sequences(target, B=3)
    drafter = _sharp(target, 4)
    drafter.int8 = True
    drafter.bind(target)
    with torch.inference_mode():
        exact = drafter.head.train_forward(tokens, hidden)
        int8 = drafter.drafting_head.train_forward(tokens, hidden)
        same_top1 = (drafter.head.logits(exact).argmax(-1) == drafter.head.logits(int8).argmax(-1)).float().mean()
    assert ((int8 - exact).norm() / exact.norm()).item() < 0.05
    assert same_top1.item() >= 0.9


def test_bind_rebuilds_the_int8_copy_from_the_current_head(target):
    drafter = _sharp(target, 5)
    drafter.int8 = True
    drafter.bind(target)

    def int8_weight() -> torch.Tensor:
        return drafter.drafting_head.layers[0].mlp.up_proj.weight().dequantize()

    weight = drafter.head.layers[0].mlp.up_proj.weight
    step = weight.abs().amax().item() / 127  # one quantization step (per channel it is smaller)
    torch.testing.assert_close(int8_weight(), weight, atol=step, rtol=0)
    with torch.no_grad():
        weight.mul_(-1)  # e.g. a training step on the float head
    assert not torch.allclose(int8_weight(), weight, atol=step, rtol=0)
    drafter.bind(target)  # the engine binds every pushed drafter
    torch.testing.assert_close(int8_weight(), weight, atol=step, rtol=0)
    clone = drafter.clone()
    assert clone.int8 and clone.drafting_head is clone.head  # float until an engine binds it


def test_int8_needs_a_float32_cpu_target(target):
    drafter = EagleDrafter.from_target(target, seed=0)
    drafter.int8 = True
    with pytest.raises(ValueError, match="int8 drafting needs a float32 target on CPU"):
        drafter.bind(copy.deepcopy(target).to(torch.bfloat16))


def test_int8_with_a_drafter_that_has_no_head_is_a_clear_error(target):
    with pytest.raises(ValueError, match="a ngram drafter has none"):
        NativeEngine(target, eos_token_id=None, max_seq_len=32, drafter=NgramDrafter(), draft_int8=True)


@pytest.mark.parametrize(
    "overrides",
    [["speculative.draft_int8=true", "drafter.kind=ngram"], ["speculative.draft_int8=true", "rollout.backend=vllm"]],
)
def test_config_rejects_int8_outside_native_eagle(overrides):
    from tlt.backends import check_backend_config

    with pytest.raises(ConfigError, match="speculative.draft_int8"):
        fixed = ["speculative.tuner=fixed", "speculative.strategies=['3_1_4']"]
        check_backend_config(load_config(None, [*overrides, *fixed]))

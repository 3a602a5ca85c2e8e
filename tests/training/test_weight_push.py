"""push(): policy weights and drafter land together at one version, or neither does; the EAGLE drafter never
writes the target's embedding / LM head, and SD stays greedy-identical after a push."""

import pytest
import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters.base import Drafter
from tlt.drafters.eagle import EagleDrafter
from tlt.models.presets import build_model
from tlt.schedulers.tuners import FixedTuner
from tlt.speculative.tree import DraftTree
from tlt.training.weight_push import PushError, push

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
PROMPTS = [[5, 6, 7, 8], [10, 11], [40]]


def _random(seed: int, preset: str = "test") -> torch.nn.Module:
    """A tiny Qwen2 (vocab 64, tied embedding / LM head) with scaled-up weights: varied greedy output."""
    torch.set_num_threads(1)
    model = build_model(preset, vocab_size=64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15, generator=g)
    return model


@pytest.fixture
def engine() -> NativeEngine:
    """An SD engine at version 0 (policy seed 0, its own untrained drafter)."""
    target = _random(0)
    engine = NativeEngine(target, eos_token_id=None, max_seq_len=48, tuner=FixedTuner("3_1_4"))
    push(engine, target.state_dict(), EagleDrafter.from_target(target, seed=0), version=0)
    return engine


def _snapshot(engine: NativeEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


def _assert_unchanged(engine: NativeEngine, weights: dict, drafter: Drafter) -> None:
    assert engine.weights_version == 0 and engine.drafter is drafter and drafter.version == 0
    assert all(torch.equal(v, weights[k]) for k, v in engine.model.state_dict().items())


def test_push_installs_policy_and_drafter_at_one_version(engine):
    policy = _random(1)
    other = _random(2)  # the drafter was bound to another model's embedding
    drafter = EagleDrafter.from_target(other, seed=3)
    push(engine, policy.state_dict(), drafter, version=1)
    installed = engine.drafter
    assert engine.weights_version == 1 and installed.version == 1
    assert installed is not drafter and drafter.version is None  # the engine owns a copy
    assert all(torch.equal(v, drafter.head.state_dict()[k]) for k, v in installed.head.state_dict().items())
    embed = engine.model.get_input_embeddings().weight
    assert torch.equal(embed, policy.get_input_embeddings().weight)  # not the drafter's embedding
    assert torch.equal(engine.model.get_output_embeddings().weight, policy.get_output_embeddings().weight)
    assert installed.head.embed.data_ptr() == embed.data_ptr()
    assert installed.head.lm_head.data_ptr() == engine.model.get_output_embeddings().weight.data_ptr()
    assert torch.equal(drafter.head.embed, other.get_input_embeddings().weight)  # the original is untouched


def test_greedy_sd_after_push_equals_plain_decoding(engine):
    policy = _random(1)
    push(engine, policy.state_dict(), EagleDrafter.from_target(_random(2), seed=3), version=1)
    sd = engine.generate(PROMPTS, GREEDY, n=2)
    plain = NativeEngine(policy, eos_token_id=None, max_seq_len=48).generate(PROMPTS, GREEDY, n=2)
    assert any(s.sd_on for s in engine.step_stats)
    assert [r.token_ids.tolist() for r in sd] == [r.token_ids.tolist() for r in plain]


def test_training_the_replica_after_push_leaves_the_engine_copy_alone(engine):
    drafter = EagleDrafter.from_target(engine.model, seed=4)
    push(engine, engine.model.state_dict(), drafter, version=1)
    before = engine.drafter.head.fc.weight.clone()
    with torch.no_grad():
        drafter.head.fc.weight.add_(1.0)
    assert torch.equal(engine.drafter.head.fc.weight, before)


def test_drafter_for_another_target_is_rejected_and_nothing_changes(engine):
    weights, previous = _snapshot(engine), engine.drafter
    wrong = EagleDrafter.from_target(_random(5, preset="tiny"), seed=0)  # hidden size 256, not 128
    with pytest.raises(PushError, match="version 1 rejected.*keeps version 0.*hidden_size=256"):
        push(engine, _random(1).state_dict(), wrong, version=1)
    _assert_unchanged(engine, weights, previous)


def test_non_finite_drafter_is_rejected_and_nothing_changes(engine):
    weights, previous = _snapshot(engine), engine.drafter
    broken = EagleDrafter.from_target(engine.model, seed=6)
    with torch.no_grad():
        broken.head.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(PushError, match="layers.0.mlp.up_proj.weight has NaN"):
        push(engine, _random(1).state_dict(), broken, version=1)
    _assert_unchanged(engine, weights, previous)


def test_bad_policy_state_is_rejected_before_the_drafter_is_swapped(engine):
    weights, previous = _snapshot(engine), engine.drafter
    state = dict(_random(1).state_dict())
    state["model.norm.weight"] = torch.ones(3)
    with pytest.raises(PushError, match="shape mismatch"):
        push(engine, state, EagleDrafter.from_target(engine.model, seed=7), version=1)
    _assert_unchanged(engine, weights, previous)


class _ShortTrees(Drafter):
    """Binds fine but drafts one node fewer than asked."""

    kind, uses_target_hidden = "broken", False

    def bind(self, target):
        pass

    def start(self, tokens, hidden, lengths):
        self.rows = tokens.shape[0]

    def append(self, tokens, prev_hidden, counts):
        pass

    def keep(self, rows):
        pass

    def propose(self, strategy):
        n = strategy.verify_tokens - 1
        return DraftTree(torch.zeros(self.rows, n, dtype=torch.long), torch.arange(-1, n - 1).expand(self.rows, n))

    def save(self, path):
        pass


def test_drafter_failing_the_dry_run_is_rejected(engine):
    weights, previous = _snapshot(engine), engine.drafter
    with pytest.raises(PushError, match="dry run"):
        push(engine, _random(1).state_dict(), _ShortTrees(), version=1)
    _assert_unchanged(engine, weights, previous)

"""One full single-process RL step on a tiny random policy, with TLT on (EAGLE drafter, cost tuner, online
drafter training) and off (plain decoding, no drafter): metrics, the policy update, the push to the engine,
and the drafter buffer's hidden states against a direct forward of the pre-step policy."""

import copy
import math

import pytest
import torch

from tlt.config import ConfigError, load_config
from tlt.data.prompts import format_prompt
from tlt.data.tasks import MathProblem
from tlt.models.presets import build_model
from tlt.models.tokenizer import train_tokenizer
from tlt.training.rl_loop import RLTrainer, StepMetrics

PROBLEMS = [
    MathProblem("What is 2 + 3?", "5", "chain_sum", 1, "2 + 3 = 5. The answer is \\boxed{5}."),
    MathProblem("What is 7 - 4?", "3", "chain_sum", 1, "7 - 4 = 3. The answer is \\boxed{3}."),
    MathProblem("What is 6 * 2?", "12", "products", 1, "6 * 2 = 12. The answer is \\boxed{12}."),
]
COMMON = [
    "model.preset=test",
    "rollout.samples_per_prompt=4",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=8",
    "rollout.max_seq_len=128",
    "grpo.minibatch_size=4",
    "grpo.lr=0.001",
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [format_prompt(p.question) + p.solution for p in PROBLEMS]
    return train_tokenizer(texts * 4, vocab_size=300)


def _policy(tokenizer):
    torch.set_num_threads(1)
    return build_model(
        "test", len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, seed=0
    )


def _by_length(texts: list[str], golds: list[str]) -> list[float]:
    """A reward that varies inside groups of a random policy (math rewards would all be 0)."""
    return [len(t) / 100 for t in texts]


def _assert_finite(m: StepMetrics) -> None:
    for name, value in m.to_dict().items():
        if value is not None and name != "timeline":
            assert math.isfinite(value), name
    assert sum(run[4] for run in m.timeline) > 0  # the decode steps of the step's generate
    assert m.num_samples == 8 and m.optimizer_steps == 2 and m.response_len_max <= 8
    assert m.logprob_gap < 1e-3  # the engine's log-probs agree with the trainer's recompute


def _assert_pushed(trainer: RLTrainer, before: dict[str, torch.Tensor]) -> None:
    engine, policy = trainer.engine, trainer.policy
    assert engine.weights_version == 1 and engine.model is not policy
    state = policy.state_dict()
    assert any(not torch.equal(state[k], v) for k, v in before.items())  # the update moved the policy
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, state[k]) and v.data_ptr() != state[k].data_ptr()


def test_step_with_tlt_on(tokenizer):
    overrides = ["drafter.batch_tokens=128", "scheduler.policy=between_steps", "scheduler.between_steps_budget=2"]
    cfg = load_config(None, COMMON + overrides)
    assert cfg.speculative.enabled and cfg.speculative.tuner == "cost"
    trainer = RLTrainer(cfg, _policy(tokenizer), tokenizer, PROBLEMS, reward_fn=_by_length)
    snapshot = copy.deepcopy(trainer.policy)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    head_before = {k: v.clone() for k, v in trainer.drafter.head.state_dict().items()}

    m = trainer.step()

    _assert_finite(m)
    assert m.version == 1 and m.drafter_steps == 2 and m.drafter_loss is not None
    assert m.sd_token_share > 0 and m.accept_length >= 1  # the cost tuner explores SD
    _assert_pushed(trainer, before)
    installed, replica = trainer.engine.drafter, trainer.drafter
    assert installed is not replica and installed.version == 1
    head = replica.head.state_dict()
    assert any(not torch.equal(head[k], v) for k, v in head_before.items())  # the drafter trained
    assert all(torch.equal(v, head[k]) for k, v in installed.head.state_dict().items())

    assert len(trainer.buffer) == m.buffer_samples == 8
    prompts = [tokenizer.encode(format_prompt(p.question)) for p in PROBLEMS]
    for sample in trainer.buffer.samples:
        assert sample.version == 0
        P = int((~sample.loss_mask).sum())
        assert sample.tokens[:P].tolist() in prompts and not sample.loss_mask[:P].any()
        assert sample.loss_mask[P:].all() and 1 <= sample.num_tokens - P <= 8
    sample = trainer.buffer.samples[5]
    with torch.no_grad():
        direct = snapshot.model(input_ids=sample.tokens[None]).last_hidden_state[0]  # [T, D] post-norm
    torch.testing.assert_close(sample.hidden, direct, atol=1e-5, rtol=1e-5)


def test_spot_in_one_process_trains_only_within_its_budget(tokenizer):
    """No worker is ever idle in one process: `spot` trains nothing with a zero budget, and with an ample one
    at most drafter.max_epochs_per_step passes over the buffer (between_steps_budget does not apply)."""
    overrides = COMMON + ["drafter.batch_tokens=128", "scheduler.between_steps_budget=1"]
    trainer = RLTrainer(load_config(None, [*overrides, "scheduler.no_idle_budget=0"]), _policy(tokenizer),
                        tokenizer, PROBLEMS, reward_fn=_by_length)  # fmt: skip
    assert trainer.cfg.scheduler.policy == "spot"
    assert [trainer.step().drafter_steps for _ in range(2)] == [0, 0]
    trainer = RLTrainer(load_config(None, [*overrides, "scheduler.no_idle_budget=1"]), _policy(tokenizer),
                        tokenizer, PROBLEMS, reward_fn=_by_length)  # fmt: skip
    trainer.cfg.scheduler.no_idle_budget = 1e6  # ample (the config caps it at 1 of the step's seconds)
    m = trainer.step()
    assert m.drafter_steps == trainer.stepper.budget() > 1 and m.drafter_loss is not None


def test_rollout_old_logprobs_take_the_engines_and_fill_the_buffer_from_its_features(tokenizer):
    """grpo.old_logprobs=rollout: the same step as a recompute, up to float rounding, without the forward; the
    drafter buffer holds the engine's features of prompt + response minus the last token."""
    overrides = COMMON + ["drafter.batch_tokens=128", "scheduler.policy=between_steps", "speculative.tuner=fixed",
                          "speculative.strategies=['3_1_4']", "grpo.kl_coef=0.01"]  # fmt: skip
    runs = {}
    for mode in ("recompute", "rollout"):
        cfg = load_config(None, [*overrides, f"grpo.old_logprobs={mode}"])
        trainer = RLTrainer(cfg, _policy(tokenizer), tokenizer, PROBLEMS, reward_fn=_by_length)
        assert trainer.old_logprobs == mode and trainer.engine.return_hidden == (mode == "rollout")
        runs[mode] = (trainer, trainer.step())
    (recomputed, a), (taken, b) = runs["recompute"], runs["rollout"]
    assert b.logprob_gap == 0 and 0 < a.logprob_gap < 1e-4  # pi_old is the engine's log-prob itself
    assert b.kl == pytest.approx(a.kl, abs=1e-6) and b.loss == pytest.approx(a.loss, abs=1e-5)
    for name, weight in recomputed.policy.state_dict().items():  # AdamW's first step moves weights by ~lr = 1e-3
        torch.testing.assert_close(taken.policy.state_dict()[name], weight, atol=5e-5, rtol=0)
    pairs = zip(recomputed.buffer.samples, taken.buffer.samples, strict=True)
    for full, engine in pairs:  # the same rollouts (fixed tuner, same seeds): the engine's sample is one shorter
        T = engine.num_tokens
        assert T == full.num_tokens - 1 and torch.equal(engine.tokens, full.tokens[:T])
        assert torch.equal(engine.loss_mask, full.loss_mask[:T])
        torch.testing.assert_close(engine.hidden, full.hidden[:T], atol=1e-4, rtol=0)


def test_auto_old_logprobs_take_the_engines_only_where_they_are_the_trainers():
    from tlt.config import GRPOConfig
    from tlt.training.grpo import old_logprobs_source

    assert old_logprobs_source(GRPOConfig(old_logprobs="auto"), "native", "cpu") == "rollout"
    assert old_logprobs_source(GRPOConfig(old_logprobs="auto"), "vllm", "cpu") == "recompute"
    assert old_logprobs_source(GRPOConfig(old_logprobs="auto", precision="bf16-mixed"), "native", "cpu") == (
        "recompute"
    )
    assert old_logprobs_source(GRPOConfig(old_logprobs="auto", precision="auto"), "native", "cuda") == "recompute"
    assert old_logprobs_source(GRPOConfig(old_logprobs="rollout", precision="bf16-mixed"), "vllm", "cpu") == ("rollout")


def test_rollout_old_logprobs_need_the_native_engine_while_the_drafter_trains():
    from tlt.config import ConfigError
    from tlt.training.rl_loop import check_rl_config

    online = ["rollout.backend=vllm", "speculative.tuner=fixed", "speculative.strategies=['3_1_4']"]
    with pytest.raises(ConfigError, match="grpo.old_logprobs: rollout fills the drafter buffer from the engine"):
        check_rl_config(load_config(None, [*online, "grpo.old_logprobs=rollout"]))
    check_rl_config(load_config(None, [*online, "grpo.old_logprobs=auto"]))  # auto recomputes there
    check_rl_config(load_config(None, [*online, "grpo.old_logprobs=rollout", "scheduler.policy=never"]))


def test_ungradable_responses_are_counted_in_the_step_metrics_and_scored_zero(tokenizer):
    def half_ungradable(texts: list[str], golds: list[str]) -> list[float]:
        return [math.nan if i % 2 else 1.0 for i in range(len(texts))]

    cfg = load_config(None, COMMON + ["speculative.enabled=false", "scheduler.policy=never"])
    m = RLTrainer(cfg, _policy(tokenizer), tokenizer, PROBLEMS, reward_fn=half_ungradable).step()
    assert m.reward_errors == 4 and m.reward_mean == 0.5 and m.accuracy == 0.5
    from tlt.training.run_log import progress_line

    assert "UNGRADED 4" in progress_line(m, 1)


def test_step_with_bf16_mixed_training(tokenizer):
    overrides = COMMON + [
        "drafter.batch_tokens=128",
        "scheduler.policy=between_steps",
        "scheduler.between_steps_budget=2",
        "grpo.precision=bf16-mixed",
    ]
    trainer = RLTrainer(load_config(None, overrides), _policy(tokenizer), tokenizer, PROBLEMS, reward_fn=_by_length)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}

    m = trainer.step()

    assert m.optimizer_steps == 2 and math.isfinite(m.loss) and m.drafter_steps == 2
    assert 1e-6 < m.logprob_gap < 0.1  # the engine decodes in float32, the trainer's forward ran in bf16
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())
    assert all(s.hidden.dtype == torch.float32 for s in trainer.buffer.samples)
    _assert_pushed(trainer, before)


def test_step_with_tlt_off(tokenizer):
    overrides = COMMON + ["speculative.enabled=false", "scheduler.policy=never", "grpo.entropy_coef=0.01"]
    trainer = RLTrainer(load_config(None, overrides), _policy(tokenizer), tokenizer, PROBLEMS)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}

    m = trainer.step()  # math rewards: 0 for a random policy, so only the entropy bonus moves it

    _assert_finite(m)
    assert m.version == 1 and m.reward_mean == 0.0 and m.entropy > 0
    assert m.sd_token_share == 0.0 and m.accept_length == 0.0
    assert m.drafter_steps == 0 and m.drafter_loss is None and m.buffer_samples == 0
    assert trainer.drafter is None and trainer.engine.drafter is None and trainer.buffer is None
    _assert_pushed(trainer, before)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("rollout.temperature=0", "rollout.temperature"),
        ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt"),
        ("drafter.kind=ngram", "needs an EAGLE drafter"),
    ],
)
def test_rl_config_errors_name_the_key(tokenizer, override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        RLTrainer(load_config(None, COMMON + [override]), _policy(tokenizer), tokenizer, PROBLEMS)


def test_frozen_ngram_drafter_under_never(tokenizer):
    overrides = COMMON + ["drafter.kind=ngram", "scheduler.policy=never"]
    cfg = load_config(None, overrides)
    trainer = RLTrainer(cfg, _policy(tokenizer), tokenizer, PROBLEMS, reward_fn=_by_length)
    m = trainer.step()
    _assert_finite(m)
    assert trainer.engine.drafter.kind == "ngram" and trainer.engine.drafter.version == 1
    assert m.drafter_steps == 0 and trainer.buffer is None and m.sd_token_share > 0

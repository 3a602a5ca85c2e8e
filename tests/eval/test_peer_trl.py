"""eval.peer_trl: TRL gets the same batch shape, hyper-parameters and prompts as tlt train."""

import pytest

from eval.peer_trl import step_prompts, trl_arguments
from tlt.config import load_config
from tlt.data.prompts import format_prompt
from tlt.data.splits import task_mix, training_problems
from tlt.training.rl_loop import ProblemSampler

pytest.importorskip("trl")


def _cfg(*overrides):
    return load_config(
        "configs/tlt.yaml",
        ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=8", "grpo.minibatch_size=16", *overrides],
    )


def test_trl_arguments_match_the_run_config(tmp_path):
    cfg = _cfg("grpo.lr=3e-5", "grpo.clip_eps=0.3", "grpo.kl_coef=0.01", "rollout.max_new_tokens=200")
    args = trl_arguments(cfg, tmp_path, steps=5)
    assert args.per_device_train_batch_size * args.steps_per_generation == 32  # one rollout of 4 x 8
    assert (args.num_generations, args.max_completion_length) == (8, 200)
    assert (args.learning_rate, args.epsilon, args.beta) == (3e-5, 0.3, 0.01)
    assert args.max_steps == 5 * 2  # two minibatch optimizer steps per RL step
    assert args.loss_type == "dapo" and args.scale_rewards == "group" and not args.shuffle_dataset


def test_partial_minibatches_are_refused(tmp_path):
    with pytest.raises(ValueError, match="multiple of grpo.minibatch_size"):
        trl_arguments(_cfg("grpo.minibatch_size=12"), tmp_path, steps=2)


def test_prompts_follow_tlts_sampler():
    cfg = _cfg()
    problems = training_problems(task_mix(cfg.data), cfg.data.train_size, cfg.data.seed)
    sampler = ProblemSampler(problems, 4, cfg.seed)
    expected = [format_prompt(p.question) for _ in range(3) for p in sampler.next()]
    assert [row["prompt"] for row in step_prompts(cfg, 3)] == expected

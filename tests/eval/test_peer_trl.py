"""eval.peer_trl: TRL gets the same batch shape, hyper-parameters and prompts as tlt train, on every generation
path and process count, and the report's ratios are taken within rounds."""

import json

import pytest

from eval.peer_trl import main, render, round_ratios, step_prompts, summarize, trl_arguments, trl_command
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
    assert not args.use_vllm and not args.use_transformers_continuous_batching


def test_two_processes_split_each_minibatch(tmp_path):
    args = trl_arguments(_cfg(), tmp_path, steps=3, processes=2)
    assert args.per_device_train_batch_size * 2 == 16 and args.steps_per_generation == 2 and args.max_steps == 6


def test_generation_paths(tmp_path):
    cfg = _cfg("rollout.max_new_tokens=512", "rollout.max_seq_len=640")
    cb = trl_arguments(cfg, tmp_path, steps=2, path="cb", processes=2)
    assert cb.use_transformers_continuous_batching and not cb.use_vllm
    config = cb.transformers_continuous_batching_config
    assert config["num_blocks"] * config["page_size"] >= 16 * 640  # the process's 16 rows at full length
    vllm = trl_arguments(cfg, tmp_path, steps=2, path="vllm")
    assert vllm.use_vllm and vllm.vllm_mode == "colocate" and vllm.vllm_max_model_length == 640


def test_partial_minibatches_are_refused(tmp_path):
    with pytest.raises(ValueError, match="grpo.minibatch_size = 12"):
        trl_arguments(_cfg("grpo.minibatch_size=12"), tmp_path, steps=2)
    with pytest.raises(ValueError, match="processes = 3"):
        trl_arguments(_cfg(), tmp_path, steps=2, processes=3)


def test_two_process_runs_go_through_accelerate(tmp_path):
    class Args:
        config, steps, overrides = "configs/tlt.yaml", 3, ["rollout.max_new_tokens=64"]

    one = trl_command(Args, "generate", 1, tmp_path)
    two = trl_command(Args, "vllm", 2, tmp_path)
    assert "accelerate.commands.launch" not in one and one[-1] == "rollout.max_new_tokens=64"
    assert two[0].endswith(".venv-vllm/bin/python") and two[1:3] == ["-m", "accelerate.commands.launch"]
    assert two[two.index("--num_processes") + 1] == "2" and two[two.index("--trl-worker") + 1] == "vllm"


def test_prompts_follow_tlts_sampler():
    cfg = _cfg()
    problems = training_problems(task_mix(cfg.data), cfg.data.train_size, cfg.data.seed)
    sampler = ProblemSampler(problems, 4, cfg.seed)
    expected = [format_prompt(p.question) for _ in range(3) for p in sampler.next()]
    assert [row["prompt"] for row in step_prompts(cfg, 3)] == expected


def _report():
    rounds = [
        {"trl-generate/1": [9.0, 8.0, 6.0, 7.0], "tlt-off/1": [3.0, 2.0, 2.0, 2.0], "tlt-on/1": [3.0, 1.0, 1.0, 1.0]},
        {"trl-generate/1": [9.0, 12.0, 12.0, 12.0], "tlt-off/1": [3.0, 3.0, 3.0, 3.0], "tlt-on/1": [2.0, 2.0, 2.0]},
    ]
    settings = {"config": "c.yaml", "overrides": [], "steps": 4, "warmup": 1, "processes": [1], "arms": []}
    settings["arms"] = ["trl-generate", "trl-cb", "tlt-off", "tlt-on"]
    batch = {"prompts_per_step": 4, "samples_per_prompt": 8, "max_new_tokens": 64, "minibatch_size": 16}
    batch["precision"] = "32-true"
    return {"settings": settings, "batch": batch, "rounds": rounds, "failed": {"trl-cb/1": "round 1: exit 1"}}


def test_ratios_pair_arms_within_a_round():
    medians = round_ratios(_report(), "median")[1]
    assert medians["engine and loop: TRL generate / tlt TLT off"] == [7.0 / 2.0, 12.0 / 3.0]
    assert medians["method: tlt TLT off / TLT on"] == [2.0, 1.5]
    assert medians["total: TRL generate / tlt TLT on"] == [7.0, 6.0]
    assert not any("cb" in name for name in medians)  # a failed arm has no ratio
    totals = round_ratios(_report())[1]  # the measured steps' seconds summed: the long tail counts
    assert totals["engine and loop: TRL generate / tlt TLT off"] == [21.0 / 6.0, 36.0 / 9.0]
    assert totals["method: tlt TLT off / TLT on"] == [2.0, 9.0 / 4.0]
    arms = summarize(_report())["median"]["arms"]
    assert arms["tlt-on/1"] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}


def test_render_names_failed_arms_and_rerenders_from_json(tmp_path):
    report = _report() | {"machine": {"cpu_model": "x"}}
    text = render(report)
    assert "| 1 | trl-cb | did not run: round 1: exit 1 | | 0 |" in text
    assert "| 1 | total: TRL generate / tlt TLT on | 8.00x (7.00-9.00) | 6.50x (6.00-7.00) |" in text
    assert "| 1 | method: tlt TLT off / TLT on | 2.12x (2.00-2.25) | 1.75x (1.50-2.00) |" in text
    (tmp_path / "peer_trl.json").write_text(json.dumps(report))
    assert main(["--render", str(tmp_path)]) == 0
    assert (tmp_path / "peer_trl.md").read_text() == text

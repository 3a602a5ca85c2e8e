"""TLT vs baseline comparison (`train.compare_baseline`): medians after warm-up, the Amdahl bound by hand,
the baseline config, and `tlt train` running both runs end to end on a random test-preset policy."""

import dataclasses
import json
import math

import pytest

from tlt.cli import main
from tlt.config import ConfigError, load_config
from tlt.eval.compare import Comparison, RunTimes, baseline_config, comparison_figure
from tlt.training.bootstrap import bootstrap_folder

from .test_train_cli import config  # noqa: F401  (the module fixture: a saved random policy and its YAML)


def _step(rollout: float, train: float, drafter: float = 0.0, reward: float = 0.5, accept: float = 0.0) -> dict:
    return {
        "num_samples": 4,
        "response_len_mean": 10.0,  # 40 response tokens per step
        "rollout_seconds": rollout,
        "train_seconds": train,
        "drafter_seconds": drafter,
        "push_seconds": 0.0,
        "reward_mean": reward,
        "accept_length": accept,
    }


def test_run_times_are_medians_after_warm_up():
    history = [_step(100.0, 100.0), _step(3.0, 1.0), _step(5.0, 1.0), _step(4.0, 2.0, accept=3.0)]
    times = RunTimes.of(history, warmup=1)
    assert (times.rollout, times.train, times.step) == (4.0, 1.0, 6.0)  # the 100 s warm-up step is left out
    assert times.accept_length == 3.0 and times.reward_mean == 0.5
    assert times.rollout_tokens_per_second == 120 / 12  # 3 measured steps of 40 tokens in 3 + 5 + 4 s
    assert times.total == 16.0  # 4 + 6 + 6 s
    assert RunTimes.of(history[:1], warmup=1).step == 200.0  # too short a run: all its steps


def test_comparison_ratios_and_amdahl_bound_by_hand():
    baseline = RunTimes(step=10.0, rollout=8.0, train=2.0, drafter=0.0, reward_mean=0.4, accept_length=0.0)
    tlt = RunTimes(step=5.0, rollout=2.0, train=2.0, drafter=1.0, reward_mean=0.4, accept_length=3.5)
    result = Comparison(measured_steps=10, tlt=tlt, baseline=baseline, base_heldout_accuracy=0.25)
    assert result.speedup == 2.0 and result.rollout_speedup == 4.0 and result.rollout_share == 0.8
    assert math.isclose(result.amdahl_bound, 1 / (0.2 + 0.8 / 4))  # 2.5x
    assert "2.00x" in result.summary() and "| 0.400 | 0.400 |" in result.markdown()
    assert json.loads(json.dumps(result.to_dict()))["amdahl_bound"] == pytest.approx(2.5)
    assert result.throughput_ratio is None and "throughput (response tokens per rollout second) ratio n/a" in (
        result.markdown()
    )
    faster = dataclasses.replace(result, tlt=dataclasses.replace(tlt, rollout_tokens_per_second=300.0))
    faster.baseline = dataclasses.replace(baseline, rollout_tokens_per_second=100.0)
    assert faster.throughput_ratio == 3.0 and "ratio 3.00x" in faster.markdown()
    assert faster.to_dict()["throughput_ratio"] == 3.0
    assert result.run_ratio is None and "summed seconds of all measured steps ratio n/a" in result.markdown()
    whole = dataclasses.replace(result, tlt=dataclasses.replace(tlt, total=50.0))
    whole.baseline = dataclasses.replace(baseline, total=100.0)
    assert whole.run_ratio == 2.0 and "summed seconds of all measured steps ratio 2.00x" in whole.markdown()
    assert "| seconds of all measured steps | 50.000 | 100.000 |" in whole.markdown()


def test_a_step_ratio_above_its_amdahl_bound_is_flagged():
    baseline = RunTimes(step=2.75, rollout=0.69, train=1.96, drafter=0.0, reward_mean=0.3, accept_length=0.0)
    tlt = RunTimes(step=1.96, rollout=0.68, train=1.08, drafter=0.27, reward_mean=0.3, accept_length=1.2)
    result = Comparison(measured_steps=11, tlt=tlt, baseline=baseline, base_heldout_accuracy=0.25)
    assert result.speedup == pytest.approx(1.40, abs=0.01) and result.amdahl_bound == pytest.approx(1.0, abs=0.01)
    assert "runs differ outside the rollout (train 1.08s vs 1.96s" in result.caveat
    assert "- note: the step ratio is 1.40x its Amdahl bound" in result.markdown()
    assert "note:" in result.summary()
    honest = Comparison(measured_steps=11, tlt=tlt, baseline=dataclasses.replace(baseline, step=1.95, train=1.07),
                        base_heldout_accuracy=0.25)  # fmt: skip
    assert honest.caveat is None and "note:" not in honest.markdown()


def test_baseline_config_turns_tlt_off_and_nothing_else():
    cfg = load_config(None, ["output_dir=runs/x", "train.compare_baseline=true", "grpo.lr=0.002"])
    base = baseline_config(cfg)
    assert base.output_dir == "runs/x/baseline"
    assert not base.speculative.enabled and base.scheduler.policy == "never"
    assert not base.train.compare_baseline and base.grpo == cfg.grpo and base.rollout == cfg.rollout
    assert cfg.speculative.enabled  # the run's own config is left as it was


def test_bootstrap_folder_follows_model_path():
    assert str(bootstrap_folder(load_config(None, ["output_dir=runs/a"]))) == "runs/a"
    cfg = load_config(None, ["output_dir=runs/a/rl", "model.path=runs/a/model"])
    assert str(bootstrap_folder(cfg)) == "runs/a"
    with pytest.raises(ConfigError, match="must end in /model"):
        bootstrap_folder(load_config(None, ["model.path=runs/a/policy"]))


def test_bench_e2e_compares_with_the_same_run_without_tlt_in_turns(config, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "rl"
    overrides = ["grpo.steps=2", "train.heldout_eval=4", "eval.max_new_tokens=8", f"output_dir={out}"]
    overrides.append("train.compare_turn_steps=1")  # TLT step 1, baseline step 1, TLT step 2, baseline step 2
    assert main(["bench", "e2e", str(config), *overrides]) == 0  # = tlt train with train.compare_baseline=true
    result = json.loads((out / "speedup.json").read_text())
    base_metrics = json.loads((out / "baseline" / "checkpoint" / "metrics.json").read_text())
    assert len(base_metrics) == 2 and all(m["sd_token_share"] == 0 for m in base_metrics)
    assert result["measured_steps"] == 1 and result["baseline"]["accept_length"] == 0
    assert result["tlt"]["accept_length"] > 0  # the TLT run decoded speculatively
    assert 0 <= result["base_heldout_accuracy"] <= 1
    assert "TLT vs baseline" in (out / "speedup.md").read_text()
    assert result["machine"]["logical_cores"] >= 1 and "torch" in result["machine"]
    printed = capsys.readouterr().out
    assert "Amdahl bound" in printed
    turns = [line for line in printed.splitlines() if "with TLT off, for comparison" in line or "resuming" in line]
    assert ["steps to 1 with" in turns[0], "resuming" in turns[1], "steps to 2 with" in turns[2]] == [True] * 3
    progress = [line.split()[2] for line in printed.splitlines() if line.startswith("[tlt] step ")]
    assert progress == ["1/2", "1/2", "2/2", "2/2"]  # each arm's steps out of the run's, not the turn's


def test_bench_needs_a_config_and_names_the_harness(capsys):
    assert main(["bench", "e2e"]) == 2
    assert main(["bench", "e2e", "grpo.steps=2"]) == 2
    assert "give a config file first" in capsys.readouterr().err


def test_bootstrap_if_missing_needs_a_model_folder_path(config, tmp_path, capsys):  # noqa: F811
    overrides = ["train.bootstrap_if_missing=true", f"model.path={tmp_path / 'base' / 'policy'}"]
    assert main(["train", str(config), *overrides, "--output-dir", str(tmp_path / "rl")]) == 2
    assert "must end in /model" in capsys.readouterr().err
    assert not (tmp_path / "base").exists()  # nothing was bootstrapped or written


def test_whole_run_headline_uses_summed_seconds_by_hand():
    baseline = RunTimes(step=10.0, rollout=5.0, train=5.0, drafter=0.0, reward_mean=0.4, accept_length=0.0,
                        total=100.0, rollout_total=60.0)  # fmt: skip
    tlt = RunTimes(step=8.0, rollout=3.0, train=5.0, drafter=0.0, reward_mean=0.4, accept_length=3.0,
                   total=70.0, rollout_total=30.0)  # fmt: skip
    result = Comparison(measured_steps=10, tlt=tlt, baseline=baseline, base_heldout_accuracy=None)
    assert result.run_ratio == pytest.approx(100 / 70)
    assert result.run_rollout_speedup == 2.0 and result.run_rollout_share == 0.6
    assert result.run_amdahl_bound == pytest.approx(1 / (0.4 + 0.3))
    headline = result.markdown().split("Medians per step")[0]
    assert "whole run (seconds of all measured steps, 70.0 s vs 100.0 s): **1.43x**" in headline
    assert "rollout s = 2.00x, rollout share r = 60.0%, Amdahl bound 1.43x, measured / bound 1.00" in headline
    assert "median step (8.000 s vs 10.000 s): **1.25x**" in headline
    assert result.summary().startswith("whole run 1.43x")


def test_decode_timeline_merges_runs_of_equal_batch_and_strategy():
    from tlt.backends.base import DecodeStepStats
    from tlt.training.rl_loop import decode_timeline

    def stat(batch, strategy, seconds, tokens):
        return DecodeStepStats(batch, strategy is not None, strategy, 0, 0, tokens, seconds)

    steps = [stat(4, None, 0.1, 4), stat(4, None, 0.1, 4), stat(2, None, 0.1, 2), stat(2, "3_1_4", 0.2, 5),
             stat(2, "3_1_4", 0.2, 6), stat(1, "3_1_4", 0.1, 3), stat(1, None, 0.05, 1)]  # fmt: skip
    assert decode_timeline(steps) == [
        [4, "", 2, pytest.approx(0.2), 8],
        [2, "", 1, 0.1, 2],
        [2, "3_1_4", 2, pytest.approx(0.4), 11],
        [1, "3_1_4", 1, 0.1, 3],
        [1, "", 1, 0.05, 1],
    ]
    assert decode_timeline([]) == []


def test_comparison_figure_draws_each_arms_slowest_step_and_one_series_per_arm():
    def step(i, rollout, timeline, accept=0.0):
        return _step(rollout, 1.0, accept=accept) | {"step": i, "sd_token_share": 0.5, "timeline": timeline}

    tlt = [step(0, 9.0, [[2, "", 1, 0.5, 2]]), step(1, 2.0, [[4, "", 2, 0.5, 8], [1, "3_1_4", 3, 1.0, 9]], 3.0),
           step(2, 1.0, [[4, "", 1, 0.5, 4]], 2.5)]  # fmt: skip
    baseline = [
        step(0, 9.0, []),
        step(1, 1.5, [[4, "", 1, 0.5, 4]]),
        step(2, 3.0, [[4, "", 3, 1.0, 12], [1, "", 9, 1.8, 9]]),
    ]
    fig = comparison_figure(tlt, baseline, warmup=1)
    tlt_ax, base_ax, rollout_ax, accept_ax = fig.axes[:4]
    # the slowest measured step of each arm (step 1 of the warm-up is left out), not the same step index
    assert "TLT: slowest step (step 2" in tlt_ax.get_title() and "TLT off: slowest step (step 3" in base_ax.get_title()
    assert len(tlt_ax.collections) == 2 and len(base_ax.collections) == 2  # one bar per decode run
    assert tlt_ax.get_xlim() == base_ax.get_xlim()  # one time scale for both
    assert [line.get_label() for line in rollout_ax.get_lines()] == ["TLT", "TLT off"]
    assert [list(line.get_ydata()) for line in rollout_ax.get_lines()] == [[9.0, 2.0, 1.0], [9.0, 1.5, 3.0]]
    assert list(accept_ax.get_lines()[0].get_ydata()) == [0.0, 3.0, 2.5]
    legend = [t.get_text() for t in tlt_ax.get_legend().get_texts()]
    assert legend == ["plain decoding", "3_1_4"]

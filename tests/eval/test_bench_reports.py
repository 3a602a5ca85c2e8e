"""Report arithmetic of the backend and spot benchmarks on synthetic measurements."""

import math
from argparse import Namespace

import pytest

from eval import bench_backends, bench_interference, bench_spot


def test_backend_summary_takes_medians_and_ratios_to_native_plain():
    args = Namespace(
        temperature=0.0, prompts=2, samples=1, max_new_tokens=8, strategy="3_1_4", sd_max_batch=4, repeats=3
    )
    runs = {
        "native-plain": [{"seconds": s, "tokens": 100, "accept": 0.0} for s in (1.0, 2.0, 4.0)],
        "vllm-sd": [{"seconds": s, "tokens": 100, "accept": 2.0} for s in (0.5, 1.0, 8.0)],
    }
    outputs = {"native-plain": [[1, 2]], "vllm-sd": [[1, 3]]}
    report = bench_backends.summarize(args, list(runs), runs, {"native-plain": 0.0, "vllm-sd": 20.0}, outputs, 1.0)
    assert report["rows"]["native-plain"]["tokens_per_s"] == 50.0  # median of 100, 50, 25
    assert report["rows"]["vllm-sd"]["vs_native_plain"] == 2.0  # median 100 tok/s over 50
    assert report["greedy_identical_to_native_plain"] == {"native-plain": True, "vllm-sd": False}
    assert "| vllm-sd | 100 | 2.00x |" in bench_backends.render(report)


def test_spot_summary_reports_rollout_change_against_never():
    def row(rollout, drafter_steps):
        return {
            "rollout_seconds": rollout,
            "train_seconds": 1,
            "drafter_seconds": 0.5,
            "push_seconds": 0,
            "drafter_steps": drafter_steps,
            "spot_steps": drafter_steps,
            "idle_seconds": 2,
            "idle_train_seconds": 1.5,
            "accept_length": 2,
        }

    report = {
        "settings": {"config": "c.yaml", "overrides": [], "steps": 3, "rounds": 1},
        "machine": {},
        "policies": {
            "never": bench_spot.summarize([row(2.0, 0)] * 3),
            "spot": bench_spot.summarize([row(2.02, 12)] * 3),
        },
    }
    text = bench_spot.render(report)
    assert "| spot | 2.02 | +1.0% | - | 3.52 |" in text and "| 12 |" in text


def test_spot_paired_ratio_pairs_each_step_with_never_at_the_same_round():
    def rows(*seconds):
        return [{"rollout_seconds": s} for s in seconds]

    runs = {
        "never": [rows(1.0, 2.0, 4.0), rows(2.0, 4.0, 8.0)],  # round 2 ran in a slow phase of the machine
        "spot": [rows(1.1, 2.2, 4.4), rows(2.0, 4.0, 8.0)],
    }
    ratios = bench_spot.paired_rollout_ratios(runs)
    assert ratios["never"] == 1.0
    assert abs(ratios["spot"] - 1.05) < 1e-12  # median of 1.1, 1.1, 1.1, 1.0, 1.0, 1.0
    report = {
        "settings": {"config": "c.yaml", "overrides": [], "steps": 3, "rounds": 2},
        "machine": {},
        "policies": {p: bench_spot.summarize([{**r, **FILLER} for rs in v for r in rs]) for p, v in runs.items()},
        "rounds": runs,
        "paired_rollout_ratios": ratios,
    }
    text = bench_spot.render(report)
    assert "| +5.0% |" in text
    assert "- never: median rollout s per round 2.00, 4.00" in text
    report["round_ratios"] = bench_spot.round_ratios(runs)
    assert report["round_ratios"]["spot"] == pytest.approx([1.1, 1.0])
    text = bench_spot.render(report)
    assert "- spot vs never, paired per round: +10.0%, +0.0%; mean +5.0% (95% t-interval -58.5% to +68.5%)" in text


def test_spot_rounds_rotate_the_policy_order():
    policies = ["never", "spot", "between_steps"]
    orders = [bench_spot.round_order(policies, k) for k in range(3)]
    assert orders[1] == ["spot", "between_steps", "never"]
    assert all(sorted(o) == sorted(policies) for o in orders)
    assert [sorted(o[i] for o in orders) for i in range(3)] == [sorted(policies)] * 3  # each position once


def test_spot_interval_over_rounds_narrows_with_agreeing_rounds():
    mean, low, high = bench_spot.mean_interval([1.02, 1.03, 1.01, 1.02])
    assert mean == pytest.approx(1.02) and low < 1.02 < high and high - low < 0.03
    assert all(math.isnan(x) for x in bench_spot.mean_interval([1.02])[1:])


FILLER = {
    "train_seconds": 1,
    "drafter_seconds": 0,
    "push_seconds": 0,
    "drafter_steps": 0,
    "spot_steps": 0,
    "idle_seconds": 0,
    "idle_train_seconds": 0,
    "accept_length": 0,
}


def test_interference_slowdown_is_against_the_idle_median():
    results = {
        "idle": {"tokens_per_second": [90.0, 100.0, 300.0], "micro_steps": [0, 0, 0]},
        "train@1024": {"tokens_per_second": [80.0, 70.0, 10.0], "micro_steps": [5, 6, 7]},
    }
    summary = bench_interference.summarize(results)
    assert summary["idle"]["slowdown"] == 0.0
    assert abs(summary["train@1024"]["slowdown"] - (100 / 70 - 1)) < 1e-12
    assert summary["train@1024"]["micro_steps"] == 6
    report = {
        "settings": {"prompts": 4, "batch": 2, "max_new_tokens": 8, "target": "t", "drafter": "d", "rounds": 3},
        "machine": {},
        "conditions": summary,
    }
    assert "| train@1024 | 70 | +42.9% | 6 |" in bench_interference.render(report)


def test_spot_policy_variants_carry_their_own_overrides(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(
        bench_spot, "train_metrics", lambda config, out, steps, overrides: calls.append((out, overrides))
    )
    args = Namespace(out=str(tmp_path), config="c.yaml", steps=2, overrides=["seed=2"])
    bench_spot.run_policy(args, "spot+drafter.precision=bf16-mixed+drafter.lr=0.01", 1)
    bench_spot.run_policy(args, "never", 0)
    assert calls[0][1] == ["scheduler.policy=spot", "seed=2", "drafter.precision=bf16-mixed", "drafter.lr=0.01"]
    assert calls[0][0] == tmp_path / "spot_drafter.precision-bf16-mixed_drafter.lr-0.01-1"
    assert calls[1] == (tmp_path / "never-0", ["scheduler.policy=never", "seed=2"])

"""TLT vs the same RL run with TLT off, side by side: step-time and rollout ratios, Amdahl bound, accuracy.

`tlt train` with `train.compare_baseline=true` runs the configured (TLT) run, then the same config with
speculative decoding off, no drafter and nothing trained besides the policy, in `<output_dir>/baseline`, with the
same seeds, prompts and training settings. Times are medians over the steps after `train.warmup_steps`. With r
the baseline's rollout share of its step and s the rollout speedup, Amdahl's law bounds the step speedup by
1 / ((1 - r) + r / s); the measured ratio also pays for TLT's extra work (drafter training, the push).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from tlt.config import RunConfig
from tlt.machine import describe_machine
from tlt.models.io import atomic_write_json, atomic_write_text

PARTS = ("rollout", "train", "drafter", "push")


@dataclass
class RunTimes:
    """Median seconds per RL step of one run over its measured steps, and what it learned."""

    step: float  # rollout + train + drafter + push
    rollout: float
    train: float
    drafter: float
    reward_mean: float  # over all steps
    accept_length: float  # mean over steps that ran SD (0: none)
    heldout_accuracy: float | None = None  # greedy, final policy
    rollout_tokens_per_second: float = 0.0  # response tokens over rollout seconds, summed over measured steps
    total: float = 0.0  # step seconds summed over the measured steps: the run's wall time after warm-up

    @staticmethod
    def of(history: list[dict], warmup: int) -> RunTimes:
        measured = measured_steps(history, warmup)

        def median(key: str) -> float:
            return statistics.median(m[key] for m in measured)

        sd = [m["accept_length"] for m in history if m["accept_length"] > 0]
        return RunTimes(
            step=statistics.median(step_seconds(m) for m in measured),
            rollout=median("rollout_seconds"),
            train=median("train_seconds"),
            drafter=median("drafter_seconds"),
            reward_mean=statistics.fmean(m["reward_mean"] for m in history),
            accept_length=statistics.fmean(sd) if sd else 0.0,
            rollout_tokens_per_second=rollout_throughput(measured),
            total=sum(step_seconds(m) for m in measured),
        )


@dataclass
class Comparison:
    measured_steps: int  # per run, after warm-up
    tlt: RunTimes
    baseline: RunTimes
    base_heldout_accuracy: float | None  # the starting policy, same held-out problems
    machine: dict = dataclasses.field(default_factory=dict)  # tlt.machine.describe_machine()

    @property
    def speedup(self) -> float:
        return self.baseline.step / self.tlt.step

    @property
    def rollout_speedup(self) -> float:
        return self.baseline.rollout / self.tlt.rollout

    @property
    def throughput_ratio(self) -> float | None:
        """TLT's rollout tokens per second over the baseline's. At temperature > 0 the runs sample different
        responses and a step's rollout time follows its longest one, so this moves less than the time ratio."""
        return ratio(self.tlt.rollout_tokens_per_second, self.baseline.rollout_tokens_per_second)

    @property
    def run_ratio(self) -> float | None:
        """The baseline's summed step seconds over TLT's (the measured steps' wall time; long steps weigh
        more than in the median step ratio)."""
        return ratio(self.baseline.total, self.tlt.total)

    @property
    def rollout_share(self) -> float:
        """r: the baseline's rollout share of its step."""
        return self.baseline.rollout / self.baseline.step

    @property
    def amdahl_bound(self) -> float:
        return amdahl_bound(self.rollout_share, self.rollout_speedup)

    @property
    def of_bound(self) -> float:
        """The measured step ratio over its Amdahl bound."""
        return self.speedup / self.amdahl_bound

    @property
    def caveat(self) -> str | None:
        """A warning when the step ratio beats its Amdahl bound by more than 10%: then it is not the rollout's."""
        ratio = self.of_bound
        if ratio <= 1.1:  # below the bound is TLT's own cost (drafter training, tuner), not a measurement issue
            return None
        return (
            f"the step ratio is {ratio:.2f}x its Amdahl bound: the runs differ outside the rollout (train "
            f"{self.tlt.train:.2f}s vs {self.baseline.train:.2f}s per step; at temperature > 0 the two runs draw "
            "different samples, so response lengths and training cost differ). Read the rollout ratio, and "
            "compare step times over several seeds"
        )

    def to_dict(self) -> dict:
        derived = (
            "speedup",
            "rollout_speedup",
            "throughput_ratio",
            "run_ratio",
            "rollout_share",
            "amdahl_bound",
            "caveat",
        )
        return asdict(self) | {name: getattr(self, name) for name in derived}

    def summary(self) -> str:
        note = f"\nnote: {self.caveat}" if self.caveat else ""
        return (
            f"TLT step {self.tlt.step:.2f}s vs baseline {self.baseline.step:.2f}s: {self.speedup:.2f}x "
            f"(rollout {self.rollout_speedup:.2f}x, rollout share r={self.rollout_share:.0%}, Amdahl bound "
            f"{self.amdahl_bound:.2f}x, {self.of_bound:.0%} of it); held-out accuracy base "
            f"{format_percent(self.base_heldout_accuracy)} -> TLT {format_percent(self.tlt.heldout_accuracy)}, "
            f"baseline {format_percent(self.baseline.heldout_accuracy)}{note}"
        )

    def markdown(self) -> str:
        rows = [
            ("median step seconds", self.tlt.step, self.baseline.step),
            ("  rollout", self.tlt.rollout, self.baseline.rollout),
            ("  train (rewards, log-prob recompute, update)", self.tlt.train, self.baseline.train),
            ("  drafter", self.tlt.drafter, self.baseline.drafter),
            ("seconds of all measured steps", self.tlt.total, self.baseline.total),
            ("mean reward over all steps", self.tlt.reward_mean, self.baseline.reward_mean),
            ("SD accept length (tokens per verify)", self.tlt.accept_length, self.baseline.accept_length),
        ]
        lines = [
            "# TLT vs baseline (same RL, TLT off)",
            "",
            f"Medians over {self.measured_steps} steps per run after warm-up. Machine: "
            + ", ".join(f"{k} {v}" for k, v in self.machine.items()),
            "",
            "| | TLT | baseline |",
            "|---|---:|---:|",
            *(f"| {name} | {a:.3f} | {b:.3f} |" for name, a, b in rows),
            f"| held-out accuracy (greedy, final policy) | {format_percent(self.tlt.heldout_accuracy)} "
            f"| {format_percent(self.baseline.heldout_accuracy)} |",
            "",
            f"- step speedup **{self.speedup:.2f}x**; rollout speedup s = {self.rollout_speedup:.2f}x; rollout "
            f"throughput (response tokens per rollout second) ratio {format_ratio(self.throughput_ratio)}; "
            f"summed seconds of all measured steps ratio {format_ratio(self.run_ratio)}",
            f"- baseline rollout share r = {self.rollout_share:.1%}; Amdahl bound 1 / ((1 - r) + r / s) = "
            f"{self.amdahl_bound:.2f}x; measured / bound = {self.of_bound:.2f}",
            f"- held-out accuracy of the starting policy: {format_percent(self.base_heldout_accuracy)}",
            *([f"- note: {self.caveat}"] if self.caveat else []),
        ]
        return "\n".join(lines) + "\n"


def rollout_throughput(steps: list[dict]) -> float:
    """Response tokens per rollout second over `steps` (per-step metrics; 0 without rollout time)."""
    seconds = sum(m["rollout_seconds"] for m in steps)
    tokens = sum(m["response_len_mean"] * m["num_samples"] for m in steps)
    return tokens / seconds if seconds > 0 else 0.0


def step_seconds(metrics: dict) -> float:
    """One step's seconds: rollout + train + drafter + push."""
    return sum(metrics[f"{part}_seconds"] for part in PARTS)


def measured_steps(history: list[dict], warmup: int) -> list[dict]:
    """The steps after warm-up (all of them when the run is not longer than the warm-up)."""
    return history[warmup:] if len(history) > warmup else history


def amdahl_bound(rollout_share: float, rollout_speedup: float) -> float:
    """The step speedup a rollout speedup s allows at rollout share r: 1 / ((1 - r) + r / s)."""
    return 1 / ((1 - rollout_share) + rollout_share / rollout_speedup)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or not positive (nothing measured)."""
    if numerator is None or denominator is None or numerator <= 0 or denominator <= 0:
        return None
    return numerator / denominator


def format_percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def baseline_config(cfg: RunConfig) -> RunConfig:
    """The same run with TLT off (plain decoding, no drafter, nothing trained but the policy), in
    <output_dir>/baseline."""
    return dataclasses.replace(
        cfg,
        output_dir=str(Path(cfg.output_dir) / "baseline"),
        speculative=dataclasses.replace(cfg.speculative, enabled=False),
        scheduler=dataclasses.replace(cfg.scheduler, policy="never"),
        train=dataclasses.replace(cfg.train, compare_baseline=False, bootstrap_if_missing=False),
    )


def heldout_accuracy(cfg: RunConfig, model_path: str | Path) -> float | None:
    """Greedy held-out accuracy of an HF folder on `train.heldout_eval` problems of the data mix (None: 0)."""
    if cfg.train.heldout_eval == 0:
        return None
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.evaluation import evaluate
    from tlt.models.io import load_hf_folder

    model, tokenizer = load_hf_folder(model_path)
    problems = heldout_problems(task_mix(cfg.data), cfg.train.heldout_eval, cfg.data.seed)
    return evaluate(model, tokenizer, problems, cfg.eval.max_new_tokens, cfg.eval.batch_size).accuracy


def compare(cfg: RunConfig, tlt_dir: Path, baseline_dir: Path) -> Comparison:
    """The Comparison of two finished runs (their checkpoints: final policy and per-step metrics); written to
    <output_dir>/speedup.json and speedup.md."""
    histories = [json.loads((d / "checkpoint" / "metrics.json").read_text()) for d in (tlt_dir, baseline_dir)]
    times = [RunTimes.of(h, cfg.train.warmup_steps) for h in histories]
    for run_times, folder in zip(times, (tlt_dir, baseline_dir), strict=True):
        run_times.heldout_accuracy = heldout_accuracy(cfg, folder / "checkpoint" / "policy")
    result = Comparison(
        measured_steps=min(len(measured_steps(h, cfg.train.warmup_steps)) for h in histories),
        tlt=times[0],
        baseline=times[1],
        base_heldout_accuracy=heldout_accuracy(cfg, cfg.model.path),
        machine=describe_machine(),
    )
    out = Path(cfg.output_dir)
    atomic_write_json(out / "speedup.json", result.to_dict())
    atomic_write_text(out / "speedup.md", result.markdown())
    return result

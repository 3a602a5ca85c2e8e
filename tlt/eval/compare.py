"""TLT vs the same RL run with TLT off, side by side: step-time and rollout ratios, Amdahl bound, accuracy.

`tlt train` with `train.compare_baseline=true` runs the configured (TLT) run, then the same config with
speculative decoding off, no drafter and nothing trained besides the policy, in `<output_dir>/baseline`, with the
same seeds, prompts and training settings. Times are medians over the steps after `train.warmup_steps`. With r
the baseline's rollout share of its step and s the rollout speedup, Amdahl's law bounds the step speedup by
1 / ((1 - r) + r / s); the measured ratio also pays for TLT's extra work (drafter training, the push).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tlt.config import RunConfig
from tlt.files import atomic_save_figure, atomic_write_json, atomic_write_text, read_json, subplots
from tlt.machine import describe_machine

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
    rollout_total: float = 0.0  # rollout seconds summed over the measured steps

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
            rollout_total=sum(m["rollout_seconds"] for m in measured),
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
    def run_rollout_speedup(self) -> float | None:
        """s over the whole run: the baseline's summed rollout seconds over TLT's."""
        return ratio(self.baseline.rollout_total, self.tlt.rollout_total)

    @property
    def run_rollout_share(self) -> float | None:
        """r over the whole run: the baseline's summed rollout seconds over its summed step seconds."""
        return ratio(self.baseline.rollout_total, self.baseline.total)

    @property
    def run_amdahl_bound(self) -> float | None:
        r, s = self.run_rollout_share, self.run_rollout_speedup
        return None if r is None or s is None else amdahl_bound(r, s)

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
            "run_rollout_speedup",
            "run_rollout_share",
            "run_amdahl_bound",
            "caveat",
        )
        return asdict(self) | {name: getattr(self, name) for name in derived}

    def summary(self) -> str:
        note = f"\nnote: {self.caveat}" if self.caveat else ""
        run = "" if self.run_ratio is None else f"whole run {self.run_ratio:.2f}x "
        if self.run_amdahl_bound is not None:
            run += f"(rollout {self.run_rollout_speedup:.2f}x, r={self.run_rollout_share:.0%}, bound "
            run += f"{self.run_amdahl_bound:.2f}x); "
        return run + (
            f"median step TLT {self.tlt.step:.2f}s vs baseline {self.baseline.step:.2f}s: {self.speedup:.2f}x "
            f"(rollout {self.rollout_speedup:.2f}x, rollout share r={self.rollout_share:.0%}, Amdahl bound "
            f"{self.amdahl_bound:.2f}x, {self.of_bound:.0%} of it); held-out accuracy base "
            f"{format_percent(self.base_heldout_accuracy)} -> TLT {format_percent(self.tlt.heldout_accuracy)}, "
            f"baseline {format_percent(self.baseline.heldout_accuracy)}{note}"
        )

    def _headline(self) -> list[str]:
        """The whole run (summed seconds) and the median step, each with its r, s and Amdahl bound."""
        run = self.run_ratio
        if run is None or self.run_amdahl_bound is None:
            whole = "- whole run: n/a (no measured step seconds)"
        else:
            whole = (
                f"- whole run (seconds of all measured steps, {self.tlt.total:.1f} s vs {self.baseline.total:.1f} s):"
                f" **{run:.2f}x**; rollout s = {self.run_rollout_speedup:.2f}x, rollout share r = "
                f"{self.run_rollout_share:.1%}, Amdahl bound {self.run_amdahl_bound:.2f}x, measured / bound "
                f"{run / self.run_amdahl_bound:.2f}"
            )
        median = (
            f"- median step ({self.tlt.step:.3f} s vs {self.baseline.step:.3f} s): **{self.speedup:.2f}x**; rollout s"
            f" = {self.rollout_speedup:.2f}x, r = {self.rollout_share:.1%}, Amdahl bound {self.amdahl_bound:.2f}x, "
            f"measured / bound {self.of_bound:.2f}"
        )
        return [whole, median]

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
            f"{self.measured_steps} measured steps per run after warm-up. Machine: "
            + ", ".join(f"{k} {v}" for k, v in self.machine.items()),
            "",
            *self._headline(),
            "",
            "Medians per step:",
            "",
            "| | TLT | baseline |",
            "|---|---:|---:|",
            *(f"| {name} | {a:.3f} | {b:.3f} |" for name, a, b in rows),
            f"| held-out accuracy (greedy, final policy) | {format_percent(self.tlt.heldout_accuracy)} "
            f"| {format_percent(self.baseline.heldout_accuracy)} |",
            "",
            f"- rollout throughput (response tokens per rollout second) ratio {format_ratio(self.throughput_ratio)};"
            f" summed seconds of all measured steps ratio {format_ratio(self.run_ratio)}",
            "- Amdahl bound 1 / ((1 - r) + r / s): the step ratio a rollout speedup s allows when the rollout is a"
            " share r of the baseline's step; TLT's own costs (drafter training, tuner) come off it",
            f"- held-out accuracy of the starting policy: {format_percent(self.base_heldout_accuracy)}",
            *([f"- note: {self.caveat}"] if self.caveat else []),
        ]
        return "\n".join(lines) + "\n"


def response_tokens(steps: list[dict]) -> float:
    """Response tokens generated over `steps` (per-step metrics)."""
    return sum(m["response_len_mean"] * m["num_samples"] for m in steps)


def rollout_throughput(steps: list[dict]) -> float:
    """Response tokens per rollout second over `steps` (per-step metrics; 0 without rollout time)."""
    seconds = sum(m["rollout_seconds"] for m in steps)
    return response_tokens(steps) / seconds if seconds > 0 else 0.0


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
    from tlt.eval.heldout import evaluate
    from tlt.models.io import load_hf_folder

    model, tokenizer = load_hf_folder(model_path)
    problems = heldout_problems(task_mix(cfg.data), cfg.train.heldout_eval, cfg.data.seed)
    return evaluate(model, tokenizer, problems, cfg.eval.max_new_tokens, cfg.eval.batch_size).accuracy


def heldout_accuracies(cfg: RunConfig, paths: list[str | Path]) -> list[float | None]:
    """`heldout_accuracy` of each HF folder; on CPU in `train.devices` processes at once (one thread each)."""
    from tlt.training.train import resolve_device

    workers = min(cfg.train.devices, len(paths))
    if workers < 2 or cfg.train.heldout_eval == 0 or resolve_device(cfg.train.device).type != "cpu":
        return [heldout_accuracy(cfg, path) for path in paths]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        return list(pool.map(heldout_accuracy, [cfg] * len(paths), paths))


def compare(cfg: RunConfig, tlt_dir: Path, baseline_dir: Path) -> Comparison:
    """The Comparison of two finished runs (their checkpoints: final policy and per-step metrics); written to
    <output_dir>/speedup.json, speedup.md and speedup.png."""
    histories = [read_json(d / "checkpoint" / "metrics.json") for d in (tlt_dir, baseline_dir)]
    times = [RunTimes.of(h, cfg.train.warmup_steps) for h in histories]
    policies = [str(d / "checkpoint" / "policy") for d in (tlt_dir, baseline_dir)]
    print(
        f"[tlt] held-out accuracy of the base and both final policies ({cfg.train.heldout_eval} problems)", flush=True
    )
    base, times[0].heldout_accuracy, times[1].heldout_accuracy = heldout_accuracies(cfg, [cfg.model.path, *policies])
    result = Comparison(
        measured_steps=min(len(measured_steps(h, cfg.train.warmup_steps)) for h in histories),
        tlt=times[0],
        baseline=times[1],
        base_heldout_accuracy=base,
        machine=describe_machine(),
    )
    out = Path(cfg.output_dir)
    atomic_write_json(out / "speedup.json", result.to_dict())
    plot_comparison(*histories, cfg.train.warmup_steps, out / "speedup.png")
    atomic_write_text(out / "speedup.md", result.markdown() + "\n![the long tail, step by step](speedup.png)\n")
    return result


def slowest_step(history: list[dict], warmup: int) -> dict:
    """The measured step with the longest rollout."""
    return max(measured_steps(history, warmup), key=lambda m: m["rollout_seconds"])


def plot_comparison(tlt: list[dict], baseline: list[dict], warmup: int, path: Path) -> None:
    """Write `comparison_figure` to `path`."""
    atomic_save_figure(comparison_figure(tlt, baseline, warmup), path, dpi=100)


def comparison_figure(tlt: list[dict], baseline: list[dict], warmup: int):
    """The slowest step of each arm as running batch size against time (plain decoding grey, SD coloured by
    strategy), side by side on one scale; per-step rollout seconds of both arms; TLT's acceptance length and
    SD share of tokens per step. Arguments: the two runs' per-step metrics."""
    fig, axes = subplots(2, 2, figsize=(13, 8))
    from matplotlib.lines import Line2D  # matplotlib is imported only when a figure is drawn

    arms = (("TLT", tlt), ("TLT off", baseline))
    colors: dict[str, str] = {"": "0.6"}
    for ax, (name, history) in zip(axes[0], arms, strict=True):
        step = slowest_step(history, warmup)
        _draw_timeline(ax, step, colors)
        ax.set(
            title=f"{name}: slowest step (step {step['step'] + 1}, rollout {step['rollout_seconds']:.2f} s)",
            xlabel="seconds into the rollout",
            ylabel="running batch (slowest rank)",
        )
    right = max(ax.get_xlim()[1] for ax in axes[0])
    top = max(ax.get_ylim()[1] for ax in axes[0])
    for ax in axes[0]:
        ax.set_xlim(0, right)
        ax.set_ylim(0, top)
    handles = [Line2D([], [], color=c, lw=4, label=k or "plain decoding") for k, c in colors.items()]
    axes[0][0].legend(handles=handles, title="decode step")
    rollout_ax, accept_ax = axes[1]
    for name, history in arms:
        steps = [m["step"] + 1 for m in history]
        rollout_ax.plot(steps, [m["rollout_seconds"] for m in history], marker="o", label=name)
    rollout_ax.axvspan(0.5, warmup + 0.5, color="0.9", label="warm-up (not measured)")
    rollout_ax.set(xlabel="RL step", ylabel="seconds", title="rollout seconds per step", ylim=(0, None))
    rollout_ax.legend()
    steps = [m["step"] + 1 for m in tlt]
    accept_ax.plot(steps, [m["accept_length"] for m in tlt], marker="o", label="tokens per verify")
    share_ax = accept_ax.twinx()
    share_ax.plot(steps, [m["sd_token_share"] for m in tlt], color="tab:green", marker=".", label="SD share")
    share_ax.set(ylim=(0, 1.05), ylabel="share of decoded tokens from SD steps")
    accept_ax.set(
        xlabel="RL step", ylabel="tokens per verify", title="TLT: acceptance length and SD share", ylim=(0, None)
    )
    accept_ax.legend(loc="lower left")
    share_ax.legend(loc="lower right")
    for ax in axes[1]:
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    return fig


def _draw_timeline(ax, step: dict, colors: dict[str, str]) -> None:
    """One step's decode runs (`rl_loop.decode_timeline`) as horizontal bars at their running batch size; the
    time before the first decode step (prefill, setup) is left blank."""
    import matplotlib.pyplot as plt

    timeline = step.get("timeline") or []
    t = max(step["rollout_seconds"] - sum(run[3] for run in timeline), 0.0)
    palette = plt.get_cmap("tab10").colors
    for batch, strategy, _, seconds, _ in timeline:
        if strategy not in colors:
            colors[strategy] = palette[(len(colors) - 1) % len(palette)]
        ax.broken_barh([(t, seconds)], (batch - 0.4, 0.8), color=colors[strategy])
        t += seconds
    ax.set_xlim(0, max(t, 1e-3) * 1.02)
    ax.set_ylim(0, max((run[0] for run in timeline), default=1) + 1)

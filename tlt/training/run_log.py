"""What a `tlt train` run reports: a progress line per step, metrics.csv, TensorBoard, a summary plot."""

from __future__ import annotations

import csv
import io
from dataclasses import fields
from pathlib import Path

from tlt.files import atomic_save_figure, atomic_write_text, subplots
from tlt.training.rl_loop import StepMetrics

COLUMNS = [f.name for f in fields(StepMetrics) if f.name != "timeline"]  # the scalars


def progress_line(m: StepMetrics, total_steps: int) -> str:
    line = (
        f"[tlt] step {m.step + 1}/{total_steps}  reward {m.reward_mean:.3f}  acc {m.accuracy:.3f}  "
        f"len {m.response_len_mean:.1f}  rollout {m.rollout_seconds:.2f}s  train {m.train_seconds:.2f}s  "
        f"drafter {m.drafter_seconds:.2f}s  accept {m.accept_length:.2f}  SD {m.sd_token_share:.0%}"
    )
    if m.reward_errors:
        line += f"  UNGRADED {m.reward_errors}"
    if m.suffix_verifies:  # a composed drafter: the suffix drafter's share of SD rows and its acceptance
        share = m.suffix_verifies / (m.suffix_verifies + m.learned_verifies)
        line += f"  suffix {share:.0%} of SD rows, accept {1 + m.suffix_accepted / m.suffix_verifies:.2f}"
    if m.idle_seconds > 0:  # several processes: the ranks' wait for the last rollout share, and its use
        line += f"  idle {m.idle_seconds:.2f}s (spot {m.spot_steps} steps, {m.idle_train_seconds:.2f}s)"
    return line


class MetricsLog:
    """Per-step metrics to `<output_dir>/metrics.csv` and, if asked and installed, TensorBoard.

    `history` (the metrics of the steps a resumed run already has) is rewritten to the CSV first, dropping
    rows of steps after the checkpoint; TensorBoard drops them through `purge_step`.
    """

    def __init__(self, output_dir: Path, history: list[dict], tensorboard: bool):
        self.csv_path = output_dir / "metrics.csv"
        text = io.StringIO()
        writer = csv.DictWriter(text, COLUMNS, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(history)
        atomic_write_text(self.csv_path, text.getvalue())
        self.writer = _summary_writer(output_dir / "tensorboard", len(history)) if tensorboard else None

    def append(self, m: StepMetrics) -> None:
        with self.csv_path.open("a", newline="") as f:
            csv.DictWriter(f, COLUMNS, lineterminator="\n", extrasaction="ignore").writerow(m.to_dict())
        if self.writer is not None:
            for name, value in m.to_dict().items():
                if name in COLUMNS and name != "step" and value is not None:
                    self.writer.add_scalar(f"rl/{name}", value, m.step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _summary_writer(log_dir: Path, purge_step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("[tlt] tensorboard is not installed (pip install tensorboard): metrics go to metrics.csv only")
        return None
    return SummaryWriter(str(log_dir), purge_step=purge_step)


def plot_summary(metrics: list[dict], path: Path) -> None:
    """Step-time split (stacked rollout / train / drafter seconds), reward and accuracy, acceptance length."""
    steps = [m["step"] + 1 for m in metrics]
    fig, (time_ax, reward_ax, accept_ax) = subplots(1, 3, figsize=(14, 4))
    bottom = [0.0] * len(metrics)
    for part in ("rollout", "train", "drafter"):
        seconds = [m[f"{part}_seconds"] for m in metrics]
        time_ax.bar(steps, seconds, bottom=bottom, label=part)
        bottom = [b + s for b, s in zip(bottom, seconds, strict=True)]
    time_ax.set(xlabel="RL step", ylabel="seconds", title="step time")
    time_ax.legend()
    reward_ax.plot(steps, [m["reward_mean"] for m in metrics], marker="o", label="mean reward")
    reward_ax.plot(steps, [m["accuracy"] for m in metrics], marker=".", label="accuracy")
    reward_ax.set(xlabel="RL step", title="reward")
    reward_ax.legend()
    accept_ax.plot(steps, [m["accept_length"] for m in metrics], marker="o", label="all SD rows")
    if any(m.get("suffix_verifies", 0) for m in metrics):  # a composed drafter: who drafted the accepted tokens
        for source in ("learned", "suffix"):
            accept_ax.plot(
                steps, [part_tokens_per_verify(m, source) for m in metrics], marker=".", label=f"{source} rows"
            )
        accept_ax.legend()
    accept_ax.set(xlabel="RL step", ylabel="tokens per verify", title="acceptance length (0: no SD)")
    for ax in (time_ax, reward_ax, accept_ax):
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)


def part_tokens_per_verify(m: dict, source: str) -> float:
    """Tokens per verify (accepted + 1) on the rows a composed drafter's `source` part drafted; nan without any."""
    verifies = m.get(f"{source}_verifies", 0)
    return 1 + m[f"{source}_accepted"] / verifies if verifies else float("nan")

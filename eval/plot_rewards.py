"""Training-reward curves of several `tlt train` runs, e.g. TLT on and off over seeds (do they overlap?).

  python -m eval.plot_rewards baseline-s0=runs/rl160 tlt-s0=runs/tlt160 --window 20 --out rewards.png

Plots each run's reward per step as a moving average over `--window` steps, and prints a table of the mean reward
per window of steps. Runs on the same seed draw the same prompts at every step, so their curves are paired.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tlt.eval.train_runs import metric_column
from tlt.files import atomic_save_figure, subplots


def window_means(values: list[float], window: int) -> list[float]:
    """Means of consecutive, non-overlapping windows (the last one may be shorter)."""
    return [sum(chunk) / len(chunk) for chunk in (values[i : i + window] for i in range(0, len(values), window))]


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` steps ending at each step."""
    return [sum(values[max(0, i + 1 - window) : i + 1]) / min(window, i + 1) for i in range(len(values))]


def plot(curves: dict[str, list[float]], window: int, out: Path) -> None:
    fig, ax = subplots(figsize=(8, 4))
    for label, rewards in curves.items():
        ax.plot(range(len(rewards)), moving_average(rewards, window), label=label)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"training reward (mean of the last {window} steps)")
    ax.legend()
    fig.tight_layout()
    atomic_save_figure(fig, out)


def _label_and_dir(item: str) -> tuple[str, str]:
    label, sep, run_dir = item.partition("=")
    if not sep or not label or not run_dir:
        raise argparse.ArgumentTypeError(f"expected LABEL=RUN_DIR, got {item!r}")
    return label, run_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=_label_and_dir, help="LABEL=RUN_DIR (a `tlt train` output folder)")
    p.add_argument("--window", type=int, default=20, help="steps per window (default 20)")
    p.add_argument("--out", required=True, help="PNG path")
    args = p.parse_args(argv)
    if args.window < 1:
        p.error(f"--window must be >= 1, got {args.window}")
    curves = {label: metric_column(run_dir, "reward_mean") for label, run_dir in args.runs}
    plot(curves, args.window, Path(args.out))
    tables = {label: window_means(r, args.window) for label, r in curves.items()}
    rows = max(len(t) for t in tables.values())
    print("| steps | " + " | ".join(tables) + " |\n|---|" + "---:|" * len(tables))
    for i in range(rows):
        cells = [f"{t[i]:.3f}" if i < len(t) else "" for t in tables.values()]
        print(f"| {i * args.window}-{(i + 1) * args.window - 1} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

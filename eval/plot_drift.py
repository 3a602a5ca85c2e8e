"""Policy-drift experiment report: acceptance length per RL step of a frozen vs an adaptive drafter.

Run the same `tlt train` twice, once with `scheduler.policy=never` (the drafter from `drafter.path` stays
frozen) and once with `spot` (trained online), with the same tuner and a fixed strategy so acceptance lengths are
comparable; then:

  python -m eval.plot_drift --frozen runs/drift-frozen --adaptive runs/drift-adaptive --out runs/drift.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tlt.eval.train_runs import metric_column
from tlt.files import atomic_save_figure, subplots


def accept_lengths(run_dir: str | Path) -> list[float]:
    """accept_length per step from a run's metrics.csv."""
    return metric_column(run_dir, "accept_length")


def plot(frozen: list[float], adaptive: list[float], out: Path) -> None:
    fig, ax = subplots(figsize=(7, 4))
    ax.plot(range(len(frozen)), frozen, marker="o", label="frozen drafter (never)")
    ax.plot(range(len(adaptive)), adaptive, marker="o", label="adaptive drafter (spot)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("tokens per verify (accept length)")
    ax.legend()
    fig.tight_layout()
    atomic_save_figure(fig, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frozen", required=True)
    p.add_argument("--adaptive", required=True)
    p.add_argument("--out", required=True, help="PNG path")
    args = p.parse_args(argv)
    frozen, adaptive = accept_lengths(args.frozen), accept_lengths(args.adaptive)
    plot(frozen, adaptive, Path(args.out))
    print("| step | frozen | adaptive |\n|---|---|---|")
    for step, (f, a) in enumerate(zip(frozen, adaptive, strict=False)):
        print(f"| {step} | {f:.2f} | {a:.2f} |")
    k = min(len(frozen), len(adaptive)) - 1
    print(f"\nat step {k}: adaptive / frozen = {adaptive[k] / frozen[k]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

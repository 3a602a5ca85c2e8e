"""Run `tlt train` in a subprocess (it may spawn ranks of its own) and read its per-step metrics back."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path


def train_metrics(config: str, out: Path, steps: int, overrides: list[str], warmup: int = 1) -> list[dict]:
    """Rows of `<out>/metrics.csv` after `tlt train config grpo.steps=steps output_dir=out *overrides`, without
    the first `warmup` steps (engine and allocator warm-up)."""
    cmd = [sys.executable, "-m", "tlt.cli", "train", config, f"grpo.steps={steps}", "train.tensorboard=false"]
    cmd += [f"output_dir={out}", *overrides]
    print("[bench] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(Path(out) / "metrics.csv") as f:
        return list(csv.DictReader(f))[warmup:]


def metric_column(run_dir: str | Path, name: str) -> list[float]:
    """Column `name` of a run's metrics.csv, one float per step."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.csv in {run_dir} (run `tlt train` there first)")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if rows and name not in rows[0]:
        raise KeyError(f"{path} has no column {name!r}")
    return [float(row[name]) for row in rows]

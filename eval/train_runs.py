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

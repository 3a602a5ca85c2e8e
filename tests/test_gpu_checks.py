"""eval/gpu_checks.sh, dry-run on CPU with its QUICK sizes: every step runs, the summary table is written, and a
missing carried policy stops it at once with one clear line."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cwd: Path, out: Path) -> subprocess.CompletedProcess:
    env = os.environ | {
        "QUICK": "1",
        "NO_WHEELS": "1",
        "TLT_CHECK_DEVICE": "cpu",
        "PY": sys.executable,
        "OUT": str(out),
    }
    return subprocess.run(["bash", "eval/gpu_checks.sh"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_dry_run_on_cpu_writes_the_summary(tmp_path):
    result = _run(ROOT, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "static / eager" in summary and "| 4 | sd |" in summary  # the bench's table, plain and SD rows
    assert "main job, TLT vs TLT off" in summary and "no result" not in summary


@pytest.mark.parametrize("missing", ["policy/model.safetensors"])
def test_a_missing_carried_policy_fails_fast(tmp_path, missing):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "eval", tree / "eval")
    shutil.copytree(ROOT / "tlt", tree / "tlt", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "tlt/assets/deep_v2" / missing).unlink()
    result = _run(tree, tmp_path / "out")
    assert result.returncode == 2
    assert "FAILED: tlt/assets/deep_v2 is missing or does not match its card" in result.stdout
    assert "1/3" not in result.stdout  # nothing else ran

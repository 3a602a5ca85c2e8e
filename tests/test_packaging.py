"""`pip install .` (not editable) gives a working `tlt` outside a source checkout: the harness behind `tlt bench`
and `tlt parity` is packaged, and so are the files tlt reads at run time (lm-eval task bases, the shipped asset)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_plain_install_runs_the_harness_commands(tmp_path):
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([*pip, str(target), str(ROOT)], check=True, cwd=tmp_path, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = [sys.executable, "-c", "import tlt; print(tlt.__file__)"]
    run = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert subprocess.run(where, **run).stdout.startswith(str(target))  # not this checkout's tlt
    for command in (["bench", "rollout", "--help"], ["bench", "adaptive", "--help"], ["parity", "--help"]):
        result = subprocess.run([str(target / "bin" / "tlt"), *command], **run)
        assert result.returncode == 0, result.stderr
        assert "usage:" in result.stdout
    installed = target / "tlt"
    assert list((installed / "eval" / "lm_tasks").glob("*.yaml")), "the lm-eval task bases are not packaged"
    assert (installed / "assets" / "deep_v2" / "card.json").is_file(), "the shipped asset is not packaged"

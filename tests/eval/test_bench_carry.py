"""The carry benchmark: plain engine vs drafter + cost tuner, round by round, on a random test-preset policy."""

import json
import re

import pytest

from eval.bench_carry import main
from tests.tiny_model import save_tiny_model


def test_smoke_run_reports_every_round_and_the_median_ratio(tmp_path):
    target = save_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["--target", str(target), "--prompts", "2", "--samples", "2", "--max-new-tokens", "12"]
    assert main([*argv, "--rounds", "3", "--out", str(out)]) == 0
    report = (out / "carry.md").read_text()
    assert len(json.loads((out / "carry.json").read_text())["rounds"]) == 3
    rows = re.findall(r"^\| (\d) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", report, flags=re.M)
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    median = float(re.search(r"over 3 rounds: \*\*([\d.]+)\*\*", report).group(1))
    assert median == pytest.approx(sorted(float(r[1]) for r in rows)[1], abs=1e-3)

"""eval.bench_chain_path: report arithmetic, a short run on a test policy (both SD arms emit the same tokens), and
the committed reports render from their raw data."""

import json
from pathlib import Path

import pytest

from eval.bench_chain_path import main, paired_ratio, same_tokens, summarize, table
from tests.tiny_model import save_math_policy

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


def _arm(seconds, tokens, plain_steps=0, plain_seconds=0.0, sd_steps=0, sd_seconds=0.0, verifies=0, sd_tokens=0):
    return {
        "seconds": seconds, "tokens": tokens, "plain_steps": plain_steps, "plain_seconds": plain_seconds,
        "sd_steps": sd_steps, "sd_seconds": sd_seconds, "sd_verifies": verifies, "sd_tokens": sd_tokens, "accepted": 0,
    }  # fmt: skip


def test_steps_are_compared_with_the_same_rounds_plain_step_and_the_sd_arms_are_paired():
    rounds = [
        {"1": {"plain": _arm(1.0, 100, 100, 1.0), "sd_tree_path": _arm(0.8, 100, 0, 0, 50, 0.8, 50, 100),
               "sd_chain_path": _arm(0.5, 100, 0, 0, 50, 0.5, 50, 100)}},
        {"1": {"plain": _arm(2.0, 100, 100, 2.0), "sd_tree_path": _arm(1.0, 80, 0, 0, 40, 1.0, 40, 80),
               "sd_chain_path": _arm(1.0, 80, 0, 0, 40, 1.0, 40, 80)}},
    ]  # fmt: skip
    report = {"rounds": rounds}
    rows = {r["arm"]: r for r in summarize(report, 1)}
    assert rows["plain"]["ms_plain_step"] == pytest.approx(15.0)  # 10 and 20 ms
    assert rows["sd_chain_path"]["ms_sd_step"] == pytest.approx(17.5)  # 10 and 25 ms
    assert rows["sd_chain_path"]["sd_step_in_plain"] == pytest.approx(1.125)  # 1.0 and 1.25
    assert rows["sd_tree_path"]["ratio"] == pytest.approx((1.425, 1.25, 1.6))  # 125 / 100 and 80 / 50 tokens/s
    assert rows["sd_tree_path"]["tokens_per_verify"] == pytest.approx(2.0)
    assert paired_ratio(report, 1) == pytest.approx((1.3, 1.0, 1.6))
    assert same_tokens(report, 1)
    rounds[1]["1"]["sd_chain_path"]["tokens"] = 81
    assert not same_tokens(report, 1)


def test_a_short_run_writes_the_table_and_the_sd_arms_agree(tmp_path):
    policy = save_math_policy(tmp_path / "policy")
    out = tmp_path / "out"
    argv = ["--target", str(policy), "--prompts", "2", "--batches", "1,2", "--max-new-tokens", "12", "--rounds", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads((out / "chain_path.json").read_text())
    assert set(report["rounds"][0]["2"]) == {"plain", "sd_tree_path", "sd_chain_path"}
    assert same_tokens(report, 1) and same_tokens(report, 2)
    assert (out / "chain_path.md").read_text() == table(report)


def test_a_tree_strategy_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["--target", "x", "--strategy", "3_2_5", "--out", str(tmp_path)])


@pytest.mark.parametrize("folder", ["chain_path_tiny", "chain_path_deep_v2"])
def test_the_committed_report_renders_from_its_json(folder):
    report = json.loads((RESULTS / folder / "chain_path.json").read_text())
    assert table(report) == (RESULTS / folder / "chain_path.md").read_text()

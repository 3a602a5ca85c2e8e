"""eval.bench_packed: report arithmetic, a short run on a test policy, and the committed reports render from their
raw data."""

import json
from pathlib import Path

import pytest

from eval.bench_packed import main, summarize_costs, summarize_decoding, table
from tests.tiny_model import save_math_policy

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


def test_costs_take_medians_over_rounds_and_compare_with_the_same_weights_plain_step():
    rounds = [
        {"1x1": {"linear": 2.0, "packed": 2.0}, "1x6": {"linear": 4.0, "packed": 2.0}},
        {"1x1": {"linear": 3.0, "packed": 2.5}, "1x6": {"linear": 5.0, "packed": 2.5}},
        {"1x1": {"linear": 2.5, "packed": 3.0}, "1x6": {"linear": 4.5, "packed": 3.0}},
    ]
    rows = {r["new_tokens"]: r for r in summarize_costs({"forward_costs": rounds})}
    assert rows[6]["linear_ms"] == pytest.approx(4500) and rows[6]["packed_ms"] == pytest.approx(2500)
    assert rows[6]["linear_per_step"] == pytest.approx(4.5 / 2.5) and rows[6]["packed_per_step"] == pytest.approx(1.0)
    assert rows[6]["speedup"] == pytest.approx(2.0)  # per round 2.0, 2.0, 1.5
    assert rows[1]["linear_per_step"] == 1.0


def test_decoding_compares_each_round_with_its_own_plain_linear_run():
    def arm(seconds, tokens, verifies=0, sd_tokens=0):
        return {"seconds": seconds, "tokens": tokens, "sd_verifies": verifies, "sd_tokens": sd_tokens}

    rounds = [
        {"1": {"plain/linear": arm(1.0, 100), "sd/packed": arm(0.5, 100, 40, 80)}},
        {"1": {"plain/linear": arm(2.0, 100), "sd/packed": arm(1.0, 60, 20, 60)}},
    ]
    rows = {r["arm"]: r for r in summarize_decoding({"decoding": rounds})}
    assert rows["plain/linear"]["ratio_median"] == 1.0 and rows["plain/linear"]["tokens_per_verify"] is None
    assert rows["sd/packed"]["ratio_range"] == pytest.approx((1.2, 2.0))
    assert rows["sd/packed"]["tokens_per_second"] == pytest.approx(160 / 1.5)
    assert rows["sd/packed"]["tokens_per_verify"] == pytest.approx(140 / 60)


def test_a_short_run_writes_both_tables(tmp_path):
    policy = save_math_policy(tmp_path / "policy")
    out = tmp_path / "out"
    argv = ["--target", str(policy), "--prompts", "2", "--batches", "1,2", "--max-new-tokens", "12", "--rounds", "1"]
    argv += ["--cost-batches", "1", "--new-tokens", "1,4", "--reps", "2", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "packed.json").read_text())
    assert set(report["decoding"][0]["2"]) == {"plain/linear", "plain/packed", "sd/linear", "sd/packed"}
    assert (out / "packed.md").read_text() == table(report)


@pytest.mark.parametrize("folder", ["packed_tiny", "packed_deep_v2"])
def test_the_committed_report_renders_from_its_json(folder):
    report = json.loads((RESULTS / folder / "packed.json").read_text())
    assert table(report) == (RESULTS / folder / "packed.md").read_text()

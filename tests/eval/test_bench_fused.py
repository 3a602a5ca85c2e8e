"""eval.bench_fused: report arithmetic and a short run on a test policy (the stacked path runs; the report renders
from its raw data)."""

import json
from pathlib import Path

import pytest

from eval.bench_fused import main, summarize, table
from tests.tiny_model import save_math_policy


def _arm(seconds, tokens, verifies=0, sd_tokens=0):
    return {"seconds": seconds, "tokens": tokens, "sd_verifies": verifies, "sd_tokens": sd_tokens}


def test_costs_and_decoding_compare_within_each_round():
    report = {
        "forward_costs": [
            {"1x6": {"apart": 3.0, "stacked": 2.0}, "16x1": {"apart": 1.0, "stacked": 1.0}},
            {"1x6": {"apart": 2.0, "stacked": 2.0}, "16x1": {"apart": 1.0, "stacked": 1.0}},
            {"1x6": {"apart": 4.0, "stacked": 2.5}, "16x1": {"apart": 1.0, "stacked": 1.0}},
        ],
        "decoding": [
            {"1": {"plain/apart": _arm(1.0, 100), "sd/stacked": _arm(0.5, 100, 40, 80)}},
            {"1": {"plain/apart": _arm(2.0, 100), "sd/stacked": _arm(1.0, 60, 20, 60)}},
        ],
    }
    rows = summarize(report)
    assert [r["cell"] for r in rows["costs"]] == ["1x6", "16x1"]  # by (b, N), not as text
    first = rows["costs"][0]
    assert first["apart_ms"] == pytest.approx(3000) and first["stacked_ms"] == pytest.approx(2000)
    assert first["speedup"] == pytest.approx((1.5, 1.0, 1.6))
    sd = {r["arm"]: r for r in rows["decoding"]}["sd/stacked"]
    assert sd["ratio"] == pytest.approx((1.6, 1.2, 2.0)) and sd["tokens_per_verify"] == pytest.approx(140 / 60)


def test_a_short_run_writes_both_tables(tmp_path):
    policy = save_math_policy(tmp_path / "policy")
    out = tmp_path / "out"
    argv = ["--target", str(policy), "--prompts", "2", "--batches", "1,2", "--max-new-tokens", "12", "--rounds", "1"]
    argv += ["--cost-batches", "2", "--new-tokens", "1,4", "--reps", "2", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "fused.json").read_text())
    assert set(report["decoding"][0]["2"]) == {"plain/apart", "plain/stacked", "sd/apart", "sd/stacked"}
    assert set(report["forward_costs"][0]) == {"2x1", "2x4"}
    assert (out / "fused.md").read_text() == table(report)


@pytest.mark.parametrize("folder", ["fused_tiny", "fused_tiny_8rounds", "fused_deep_v2"])
def test_the_committed_report_renders_from_its_json(folder):
    results = Path(__file__).resolve().parents[2] / "eval" / "results" / folder
    assert table(json.loads((results / "fused.json").read_text())) == (results / "fused.md").read_text()

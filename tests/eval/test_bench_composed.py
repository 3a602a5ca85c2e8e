"""eval.bench_composed: the committed report is what its table renders from the committed raw data, and the
summary sums over rounds as the report says."""

import json
from pathlib import Path

import pytest

from eval.bench_composed import summarize, table

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


@pytest.mark.parametrize(
    "folder",
    [
        "composed_deep_v1",
        "composed_deep_v2_packed",
        "composed_deep_v2_packed_greedy",
        "composed_deep_v2_packed_greedy_fixed",
        "composed_deep_v2_trust",
        "composed_deep_v2_trust_greedy",
        "composed_deep_v2_trust_greedy_fixed",
    ],
)
def test_the_committed_report_renders_from_its_json(folder):
    report = json.loads((RESULTS / folder / "composed.json").read_text())
    assert table(report) == (RESULTS / folder / "composed.md").read_text()


def test_tokens_per_second_are_summed_over_rounds_and_compared_with_eagle():
    def run(seconds, tokens, **extra):
        return {"seconds": seconds, "tokens": tokens, "sd_verifies": 10, "accepted": 20, "sd_tokens": tokens} | extra

    attribution = {"learned": {"verifies": 9, "accepted": 18}, "suffix": {"verifies": 1, "accepted": 3}}
    rounds = [
        {
            "plain": [run(2.0, 100)] * 2,
            "eagle": [run(1.0, 100)] * 2,
            "composed": [run(s, 100, attribution=attribution)] * 2,
        }
        for s in (0.5, 2.0)
    ]
    rows = {(r["pass"], r["arm"]): r for r in summarize({"rounds": rounds})}
    composed = rows[(1, "composed")]
    assert composed["tokens_per_second"] == 200 / 2.5 and composed["vs_eagle"] == 0.8
    assert composed["time_ratios"] == [2.0, 0.5]  # eagle's 1 s over 0.5 s and 2 s, per round
    assert composed["suffix_share"] == 0.1 and composed["suffix_accepted"] == 3
    assert rows[(2, "plain")]["vs_eagle"] == 0.5

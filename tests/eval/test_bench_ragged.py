"""eval.bench_ragged and eval.bench_suffix: report arithmetic, and the committed reports render from their raw
data."""

import json
from pathlib import Path

import pytest

from eval.bench_ragged import _bucket, summarize, table
from eval.bench_suffix import accepted_length
from eval.bench_suffix import table as suffix_table

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"


@pytest.mark.parametrize(("folder", "name", "render"), [("ragged_tiny", "ragged", table)])
def test_the_committed_report_renders_from_its_json(folder, name, render):
    report = json.loads((RESULTS / folder / f"{name}.json").read_text())
    assert render(report) == (RESULTS / folder / f"{name}.md").read_text()


def test_the_committed_suffix_reports_render_from_their_json():
    for folder in ("suffix_deep_v1", "suffix_tiny"):
        report = json.loads((RESULTS / folder / "suffix.json").read_text())
        assert suffix_table(report) == (RESULTS / folder / "suffix.md").read_text()


def test_batch_sizes_fall_in_inclusive_buckets():
    assert [_bucket(n) for n in (1, 2, 4, 5, 8, 9, 16, 17, 128)] == ["1", "2-4", "2-4", "5-8", "5-8", "9-16",
                                                                       "9-16", "17+", "17+"]  # fmt: skip


def test_rates_sum_over_rounds_and_compare_with_plain_per_round_and_per_bucket():
    def run(seconds, tokens, sd_tokens, buckets):
        counts = {"sd_verifies": 10, "accepted": 5, "drafted": 20}
        return {"seconds": seconds, "tokens": tokens, "sd_tokens": sd_tokens, "buckets": buckets} | counts

    plain = run(1.0, 100, 0, {"1": [10, 0.5, 0], "9-16": [90, 0.5, 0]})
    sd = [run(s, 100, 50, {"1": [10, 0.25, 10], "9-16": [90, 0.75, 40]}) for s in (0.5, 2.0)]
    rounds = [{"plain": [plain] * 2, "padded": [x] * 2, "ragged": [x] * 2, "ragged_cost": [x] * 2} for x in sd]
    rows = {(r["pass"], r["arm"]): r for r in summarize({"rounds": rounds})}
    ragged = rows[(2, "ragged")]
    assert ragged["tokens_per_second"] == 200 / 2.5 and ragged["vs_plain"] == 0.8
    assert ragged["vs_plain_median"] == (2.0 + 0.5) / 2 and ragged["vs_plain_range"] == [0.5, 2.0]
    assert ragged["tokens_per_verify"] == 1.5 and ragged["drafted_per_verify"] == 2.0
    assert ragged["buckets"]["1"] == {"tokens_per_second": 40.0, "sd_share": 1.0}
    assert ragged["buckets"]["9-16"] == {"tokens_per_second": 120.0, "sd_share": 80 / 180}
    report = {"rounds": rounds, "settings": {"target": "t", "prompts": 2, "group": 1, "samples": 2,
              "max_new_tokens": 8, "strategy": "5_1_6", "strategies": "3_1_4", "rounds": 2}, "machine": {}}  # fmt: skip
    assert "| 2 | ragged | 40 (2.00x, SD 100%) | 120 (0.67x, SD 44%) |" in table(report)


def test_replayed_acceptance_walks_a_tree_to_the_realized_tokens():
    # root -> 7 -> 8 -> 9 and root -> 5 -> 6: the realized 5, 6, 4 takes the second branch for two tokens
    tokens, parents = [0, 7, 5, 8, 6, 9], [-1, 0, 0, 1, 2, 3]
    assert accepted_length(tokens, parents, [5, 6, 4]) == 2
    assert accepted_length(tokens, parents, [7, 8, 9, 1]) == 3
    assert accepted_length(tokens, parents, [7, 8]) == 2  # no further than the realized tokens
    assert accepted_length(tokens[:3], parents[:3], [7, 8, 9]) == 1  # nodes past a row's real count are not there

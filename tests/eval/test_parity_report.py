"""The parity report: a mismatch under --sd-only fails and is listed; JSON and Markdown agree."""

import json

from tlt.eval.lm import DecodeTotals
from tlt.eval.parity import ParityReport, ParitySettings, SideRun, compare_outputs
from tlt.eval.parity_report import render_markdown, write_report
from tlt.eval.parity_stats import compare_paired


def _side(label: str, tokens: dict) -> SideRun:
    texts = {k: " ".join(map(str, v)) for k, v in tokens.items()}
    return SideRun(
        label,
        {},
        {},
        tokens,
        texts,
        DecodeTotals(steps=4, sd_steps=2, drafted_tokens=8, accepted_tokens=6, generated_tokens=9),
        1.0,
    )


def _report(settings: ParitySettings) -> ParityReport:
    a = _side("A", {("t", 0): [5, 6, 7], ("t", 1): [1, 2]})
    b = _side("B", {("t", 0): [5, 6, 7], ("t", 1): [1, 3, 4]})
    compared, mismatches = compare_outputs(a, b)
    comparisons = {"t": {"strict": compare_paired([0] * 10 + [1] * 5, [1] * 10 + [1] * 5)}}
    return ParityReport(
        settings,
        ("A", "B"),
        {"t": "/d.jsonl"},
        comparisons,
        compared,
        mismatches,
        ({}, {}),
        (a.totals, b.totals),
        (1.0, 2.0),
        "0.4.x",
    )


def test_sd_only_mismatch_fails_and_is_listed(tmp_path):
    report = _report(ParitySettings("m", sd_only=True))
    assert report.failed and report.differs
    assert [(m.doc_id, m.first_diff) for m in report.mismatches] == [(1, 1)]
    json_path, md_path = write_report(report, tmp_path)
    payload = json.loads(json_path.read_text())
    assert payload["outputs"]["identical"] == 1 and payload["verdict"] == "differs"
    assert payload["results"]["t"]["strict"]["mcnemar_p"] == 2 / 2**10
    markdown = md_path.read_text()
    assert markdown == render_markdown(report)
    assert "**FAIL**" in markdown and "| t | 1 | 1 | 1 2 | 1 3 4 |" in markdown
    assert "| t | strict | 15 | 33.3% | [15.2%, 58.3%] | 100.0% | [79.6%, 100.0%] | +66.7 pt | 0 / 10 |" in markdown
    assert "- B: 4 decode steps after prefill, 2 with SD, 9 tokens; 6/8 drafted tokens accepted (75.0%)" in markdown


def test_two_model_runs_only_count_identical_outputs():
    report = _report(ParitySettings("m", "n"))
    assert not report.failed and "PASS" not in render_markdown(report)

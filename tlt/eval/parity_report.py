"""The `tlt parity` report as JSON and Markdown, written atomically."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tlt import files
from tlt.eval.lm import DecodeTotals
from tlt.eval.parity import ParityReport
from tlt.eval.parity_stats import PairedComparison, verdict

MAX_MISMATCHES_SHOWN = 10
_SNIPPET_CHARS = 80


def _comparison_dict(c: PairedComparison, alpha: float) -> dict:
    return {
        **asdict(c),
        "accuracy_a": c.accuracy_a,
        "accuracy_b": c.accuracy_b,
        "ci95_a": list(c.ci_a),
        "ci95_b": list(c.ci_b),
        "difference": c.difference,
        "mcnemar_p": c.p_value,
        "verdict": verdict(c.differs(alpha), alpha),
    }


def to_dict(report: ParityReport) -> dict:
    alpha = report.settings.alpha
    return {
        "settings": asdict(report.settings),
        "sides": {
            side: {
                "label": report.labels[i],
                "model_args": report.sides_args[i],
                "seconds": report.seconds[i],
                "decode": asdict(report.totals[i]),
            }
            for i, side in enumerate("AB")
        },
        "data_files": report.data_files,
        "results": {
            t: {m: _comparison_dict(c, alpha) for m, c in by_metric.items()}
            for t, by_metric in report.comparisons.items()
        },
        "verdict": verdict(report.differs, alpha),
        "outputs": {
            "compared": report.compared_outputs,
            "identical": report.compared_outputs - len(report.mismatches),
            "must_match": report.outputs_must_match,
            "mismatches": [asdict(m) for m in report.mismatches],
        },
        "lm_eval_version": report.lm_eval_version,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(ci: tuple[float, float]) -> str:
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _snippet(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."


def _accuracy_table(report: ParityReport) -> list[str]:
    alpha = report.settings.alpha
    rows = [
        "| task | metric | n | A | A 95% CI | B | B 95% CI | B - A | only A / only B | McNemar p | verdict |",
        "|---|---|---:|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for task, by_metric in report.comparisons.items():
        for metric, c in by_metric.items():
            cells = [
                task,
                metric,
                c.n,
                _pct(c.accuracy_a),
                _ci(c.ci_a),
                _pct(c.accuracy_b),
                _ci(c.ci_b),
                f"{100 * c.difference:+.1f} pt",
                f"{c.only_a} / {c.only_b}",
                f"{c.p_value:.3g}",
                verdict(c.differs(alpha), alpha),
            ]
            rows.append("| " + " | ".join(map(str, cells)) + " |")
    return rows


def _decode_line(side: str, t: DecodeTotals) -> str:
    rate = f" ({_pct(t.accepted_tokens / t.drafted_tokens)})" if t.drafted_tokens else ""
    return (
        f"- {side}: {t.steps} decode steps after prefill, {t.sd_steps} with SD, {t.generated_tokens} tokens; "
        f"{t.accepted_tokens}/{t.drafted_tokens} drafted tokens accepted{rate}"
    )


def _outputs_section(report: ParityReport) -> list[str]:
    identical = report.compared_outputs - len(report.mismatches)
    lines = [
        _decode_line("A", report.totals[0]),
        _decode_line("B", report.totals[1]),
        "",
        f"Identical response tokens: {identical}/{report.compared_outputs} problems.",
    ]
    if report.outputs_must_match:
        status = "PASS" if not report.mismatches else "FAIL"
        lines.append(f"Greedy decoding with SD off and on must give identical outputs (lossless SD): **{status}**.")
        if report.totals[1].sd_steps == 0:
            lines.append("Warning: SD never ran on side B, so this check compared plain decoding with itself.")
    if report.mismatches:
        shown = report.mismatches[:MAX_MISMATCHES_SHOWN]
        lines += [
            "",
            f"First {len(shown)} of {len(report.mismatches)} mismatches:",
            "",
            "| task | doc | first differing token | A | B |",
            "|---|---:|---:|---|---|",
        ]
        lines += [
            f"| {m.task} | {m.doc_id} | {m.first_diff} | {_snippet(m.text_a)} | {_snippet(m.text_b)} |" for m in shown
        ]
    return lines


def render_markdown(report: ParityReport) -> str:
    s, alpha = report.settings, report.settings.alpha
    data = ", ".join(f"{t}: `{p}`" for t, p in report.data_files.items())
    lines = [
        f"# Parity: {report.labels[0]} (A) vs {report.labels[1]} (B)",
        "",
        f"- data: {data}",
        f"- decoding: greedy, max_new_tokens {s.max_new_tokens}, batch_size {s.batch_size}; SD strategy "
        f"{s.strategy}, drafter {s.drafter} where SD is on",
        f"- time: A {report.seconds[0]:.1f} s, B {report.seconds[1]:.1f} s; lm-eval {report.lm_eval_version}",
        "",
        "## Accuracy",
        "",
        *_accuracy_table(report),
        "",
        f"**Verdict: {verdict(report.differs, alpha)}** (exact McNemar test per task and metric, two-sided, "
        "not corrected for multiple comparisons; Wilson score intervals).",
        "",
        "## Outputs",
        "",
        *_outputs_section(report),
    ]
    return "\n".join(lines) + "\n"


def write_report(report: ParityReport, folder: str | Path) -> tuple[Path, Path]:
    """Write parity.json and parity.md into `folder` (each atomically, the JSON first); returns their paths."""
    md_path = Path(folder) / "parity.md"
    files.write_report(md_path, to_dict(report), lambda _: render_markdown(report))
    return md_path.with_suffix(".json"), md_path

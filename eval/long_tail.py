"""Where a TLT-vs-baseline run's rollout seconds go, by running batch size: the decomposition of s.

    python -m eval.long_tail runs/quickstart/rl --out eval/results/quickstart_long_tail.md

reads the per-step decode timelines (`StepMetrics.timeline`: the slowest rank's decode steps as runs of equal
running batch and strategy) of both arms of a `tlt train ... train.compare_baseline=true` run, over the
measured steps, and tabulates per batch-size range: each arm's share of its decode seconds, seconds per
generated token, TLT's SD share of decode steps and its tokens per SD step and row, and the speedup per token
there. The rollout speedup s is the baseline's decode seconds over TLT's; a range's weight in s is its share
of the baseline's seconds. A second table splits TLT's decode steps of each range by what the tuner played
(each strategy, and plain decoding): milliseconds per step, rows per step, tokens per row and step (acceptance
+ 1 for SD), milliseconds per token, and the per-token speedup over the baseline's decode steps of that range.
Writes the tables and their raw data (.json next to it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tlt.eval.compare import measured_steps
from tlt.files import write_report

RANGES = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 10**9))


def batch_range(batch: int) -> str:
    """The label of the RANGES entry holding `batch` running rows ("1", "3-4", ">= 33")."""
    low, high = next(r for r in RANGES if r[0] <= batch <= r[1])
    return str(low) if low == high else (f"{low}-{high}" if high < 10**9 else f">= {low}")


def decode_by_strategy(history: list[dict], warmup: int) -> dict[str, dict[str, dict]]:
    """Per batch-size range and per strategy ('plain' for plain decoding): decode steps, rows, seconds, tokens
    (summed over the measured steps' timelines)."""
    out: dict[str, dict[str, dict]] = {}
    for step in measured_steps(history, warmup):
        for batch, strategy, steps, seconds, tokens in step.get("timeline") or []:
            cells = out.setdefault(batch_range(batch), {})
            cell = cells.setdefault(strategy or "plain", {"steps": 0, "rows": 0, "seconds": 0.0, "tokens": 0})
            cell["steps"] += steps
            cell["rows"] += steps * batch
            cell["seconds"] += seconds
            cell["tokens"] += tokens
    return out


def by_range(strategies: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """`decode_by_strategy` summed per batch-size range: decode steps, SD steps, rows of SD steps, seconds,
    tokens."""
    out = {}
    for key, cells in strategies.items():
        sd = [c for strategy, c in cells.items() if strategy != "plain"]
        out[key] = {
            "steps": sum(c["steps"] for c in cells.values()),
            "sd_steps": sum(c["steps"] for c in sd),
            "sd_rows": sum(c["rows"] for c in sd),
            "seconds": sum(c["seconds"] for c in cells.values()),
            "tokens": sum(c["tokens"] for c in cells.values()),
        }
    return out


def strategy_rows(tlt: dict[str, dict[str, dict]], base: dict[str, dict]) -> list[list[str]]:
    table = []
    for low, _ in RANGES:
        key = batch_range(low)
        b = base.get(key)
        per_b = b["seconds"] / b["tokens"] if b and b["tokens"] else None
        for strategy, c in sorted(tlt.get(key, {}).items()):
            per_t = c["seconds"] / c["tokens"] if c["tokens"] else None
            table.append(
                [
                    key,
                    strategy,
                    str(c["steps"]),
                    f"{c['rows'] / c['steps']:.1f}",
                    f"{c['seconds'] / c['steps'] * 1e3:.1f}",
                    f"{c['tokens'] / c['rows']:.2f}",
                    f"{per_t * 1e3:.2f}" if per_t else "n/a",
                    f"{per_b / per_t:.2f}x" if per_b and per_t else "n/a",
                ]
            )
    return table


def rows(tlt: dict[str, dict], base: dict[str, dict]) -> list[list[str]]:
    total = {arm: sum(c["seconds"] for c in cells.values()) for arm, cells in (("tlt", tlt), ("base", base))}
    table = []
    for low, high in RANGES:
        key = batch_range(low)
        t, b = tlt.get(key), base.get(key)
        if t is None and b is None:
            continue
        t = t or {"steps": 0, "sd_steps": 0, "sd_rows": 0, "seconds": 0.0, "tokens": 0}
        b = b or {"steps": 0, "sd_steps": 0, "sd_rows": 0, "seconds": 0.0, "tokens": 0}
        per_b = b["seconds"] / b["tokens"] if b["tokens"] else None
        per_t = t["seconds"] / t["tokens"] if t["tokens"] else None
        sd_tokens = (t["tokens"] - (t["steps"] - t["sd_steps"]) * low) if t["sd_rows"] and low == high else None
        table.append(
            [
                key,
                f"{b['seconds'] / total['base']:.0%}" if total["base"] else "n/a",
                f"{t['seconds'] / total['tlt']:.0%}" if total["tlt"] else "n/a",
                f"{per_b * 1e3:.2f}" if per_b else "n/a",
                f"{per_t * 1e3:.2f}" if per_t else "n/a",
                f"{t['sd_steps'] / t['steps']:.0%}" if t["steps"] else "n/a",
                f"{sd_tokens / t['sd_rows']:.2f}" if sd_tokens is not None else "-",
                f"{per_b / per_t:.2f}x" if per_b and per_t else "n/a",
            ]
        )
    return table


def report(raw: dict) -> str:
    """The Markdown report of `raw` ({"run", "tlt", "baseline"}: each arm's by_range)."""
    tlt, base = raw["tlt"], raw["baseline"]
    columns = ("running batch", "baseline seconds", "TLT seconds", "baseline ms / token", "TLT ms / token",
               "TLT SD steps", "tokens per SD step and row", "speedup per token")  # fmt: skip
    total_b = sum(c["seconds"] for c in base.values())
    total_t = sum(c["seconds"] for c in tlt.values())
    lines = [
        f"# Where the rollout seconds go, by running batch size: {raw['run']}"
        + (f" (TLT) against {raw['against']} (baseline)" if raw.get("against") else ""),
        "",
        "Decode steps of the slowest rank of every measured step (both arms; prefill and setup not included). "
        "Seconds: each arm's share of its own decode seconds. Tokens per SD step and row: generated tokens of "
        "the SD steps (accepted drafts + 1) per row, for single batch sizes.",
        "",
        "| " + " | ".join(columns) + " |",
        "|---|" + "---:|" * (len(columns) - 1),
        *("| " + " | ".join(r) + " |" for r in rows(tlt, base)),
        "",
        f"- decode seconds: baseline {total_b:.1f} s, TLT {total_t:.1f} s: s over decode steps {total_b / total_t:.2f}x"
        if total_t
        else "- no decode steps",
    ]
    if raw.get("tlt_strategies"):
        columns = ("running batch", "TLT played", "steps", "rows per step", "ms per step", "tokens per row and step",
                   "ms / token", "speedup per token over the baseline")  # fmt: skip
        lines += [
            "",
            "TLT's decode steps by what the tuner played (plain: plain decoding), against all of the baseline's "
            "decode steps of the same range:",
            "",
            "| " + " | ".join(columns) + " |",
            "|---|---|" + "---:|" * (len(columns) - 2),
            *("| " + " | ".join(r) + " |" for r in strategy_rows(raw["tlt_strategies"], base)),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", help="a `tlt train ... train.compare_baseline=true` output folder")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out (train.warmup_steps)")
    p.add_argument(
        "--baseline",
        help="the run to compare against (default: RUN/baseline), e.g. another cell of a sweep: "
        "runs/ablation/sd_adaptive_drafter --baseline runs/ablation/sd_frozen",
    )
    p.add_argument("--out", help="write the report here (markdown) and its raw data next to it (.json)")
    p.add_argument("--from-json", help="render from raw data written by an earlier --out")
    args = p.parse_args(argv)
    if bool(args.run) == bool(args.from_json):
        p.error("give a run folder or --from-json")
    if args.from_json:
        raw = json.loads(Path(args.from_json).read_text())
    else:
        folders = {"tlt": Path(args.run), "baseline": Path(args.baseline or Path(args.run) / "baseline")}
        paths = {arm: f / "checkpoint" / "metrics.json" for arm, f in folders.items()}
        missing = [str(path) for path in paths.values() if not path.is_file()]
        if missing:
            print(
                f"long_tail: error: {', '.join(missing)} not found (a finished compare_baseline run?)", file=sys.stderr
            )
            return 2
        histories = {arm: json.loads(path.read_text()) for arm, path in paths.items()}
        strategies = {arm: decode_by_strategy(h, args.warmup) for arm, h in histories.items()}
        raw = {"run": args.run} | {arm: by_range(cells) for arm, cells in strategies.items()}
        raw["tlt_strategies"] = strategies["tlt"]
        if args.baseline:
            raw["against"] = args.baseline
    print(write_report(args.out, raw, report) if args.out else report(raw), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

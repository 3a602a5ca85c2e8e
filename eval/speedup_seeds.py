"""TLT vs baseline over several seeds: the per-seed comparisons of `tlt train ... train.compare_baseline=true`
runs in one table, with medians across seeds.

  python -m eval.speedup_seeds runs/rl-speedup-small-s0 runs/rl-speedup-small-s1 runs/rl-speedup-small-s2 \
      --out eval/results/rl_speedup_small_seeds.md

Each run folder holds the speedup.json that `tlt train` writes (tlt.eval.compare); for a speedup.json
written before tlt reported the throughput and run ratios, they come from both runs' per-step metrics
(checkpoint/metrics.json, baseline/checkpoint/metrics.json). Besides the per-seed step and rollout ratios,
the rollout share r and the Amdahl bound, the table gives the rollout throughput ratio (response tokens per
rollout second, TLT over baseline, over the measured steps): at temperature > 0 the two runs sample different
responses, and a step's rollout time follows its longest one, so the time ratio moves with the lengths drawn
while the throughput ratio moves less; and the run ratio, the baseline's seconds over TLT's summed over the
measured steps (the wall time a user waits, where long-tail steps weigh more than in a median). The report
also says what step speedup a rollout speedup s allows at all: the bound tends to s as r -> 1, so a step goal
of G needs s >= G whatever r is, and r >= (1 - 1/G) / (1 - 1/s) when s > G.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path

from tlt.eval.compare import (
    amdahl_bound,
    format_percent,
    format_ratio,
    ratio,
    rollout_throughput,
    step_seconds,
)
from tlt.files import write_report

COLUMNS = (
    "run",
    "seed",
    "step ratio",
    "rollout ratio s",
    "r",
    "Amdahl bound",
    "of bound",
    "step s TLT / base",
    "rollout s TLT / base",
    "rollout tok/s ratio",
    "run ratio",
    "train s TLT / base",
    "accept length",
    "reward TLT / base",
    "held-out TLT / base",
)


def load_comparison(run_dir: str | Path) -> dict:
    """A run's speedup.json, with its seed (from the run's config.yaml) added."""
    run_dir = Path(run_dir)
    path = run_dir / "speedup.json"
    if not path.is_file():
        raise FileNotFoundError(f"no speedup.json in {run_dir} (run `tlt train CONFIG train.compare_baseline=true`)")
    comparison = json.loads(path.read_text())
    comparison["run"] = str(run_dir)
    comparison["seed"] = _seed(run_dir / "config.yaml")
    steps, runs = comparison["measured_steps"], (run_dir, run_dir / "baseline")
    if comparison.get("throughput_ratio") is None:  # written before tlt reported it: from the runs' metrics
        tlt, base = (_measure(d, steps, rollout_throughput) for d in runs)
        comparison["throughput_ratio"] = ratio(tlt, base)
    if comparison.get("run_ratio") is None:  # likewise: the baseline's seconds over TLT's
        tlt, base = (_measure(d, steps, _seconds) for d in runs)
        comparison["run_ratio"] = ratio(base, tlt)
    comparison["steps"] = {arm: _measure(d, steps, _per_step) for arm, d in zip(("tlt", "baseline"), runs, strict=True)}
    return comparison


STEP_KEYS = ("step", "rollout_seconds", "train_seconds", "drafter_seconds", "push_seconds", "accept_length",
             "sd_token_share", "reward_mean", "response_len_mean", "response_len_max")  # fmt: skip


def _per_step(steps: list[dict]) -> list[dict]:
    """The measured steps' times and sample statistics (the raw data of the whole-run table)."""
    return [{k: m[k] for k in STEP_KEYS if k in m} for m in steps]


def whole_run(c: dict) -> tuple[float, float, float, float] | None:
    """(run ratio, rollout s, rollout share r, Amdahl bound) over the summed measured steps: from the runs'
    per-step metrics, else from the speedup.json of a tlt that reports them (run_*); None without either."""
    steps = c.get("steps") or {}
    if not steps.get("tlt") or not steps.get("baseline"):
        keys = ("run_ratio", "run_rollout_speedup", "run_rollout_share", "run_amdahl_bound")
        return tuple(c[k] for k in keys) if all(c.get(k) is not None for k in keys) else None
    total = {arm: sum(step_seconds(m) for m in steps[arm]) for arm in ("tlt", "baseline")}
    rollout = {arm: sum(m["rollout_seconds"] for m in steps[arm]) for arm in ("tlt", "baseline")}
    s, r = rollout["baseline"] / rollout["tlt"], rollout["baseline"] / total["baseline"]
    return total["baseline"] / total["tlt"], s, r, amdahl_bound(r, s)


def whole_run_row(c: dict) -> list[str]:
    run = whole_run(c)
    if run is None:
        return [c["run"], str(c["seed"]), "n/a", "n/a", "n/a", "n/a", "n/a"]
    ratio_, s, r, bound = run
    return [
        c["run"],
        str(c["seed"]),
        f"{ratio_:.2f}x",
        f"{s:.2f}x",
        f"{r:.0%}",
        f"{bound:.2f}x",
        f"{ratio_ / bound:.2f}",
    ]


def _measure(run_dir: Path, steps: int, measure) -> float | None:
    """`measure` of a run's last `steps` per-step metrics (None: no metrics file)."""
    path = run_dir / "checkpoint" / "metrics.json"
    if not path.is_file():
        return None
    return measure(json.loads(path.read_text())[-steps:])


def _seconds(steps: list[dict]) -> float:
    return sum(step_seconds(m) for m in steps)


def _seed(config_path: Path) -> int | None:
    from omegaconf import OmegaConf

    return OmegaConf.load(config_path).get("seed") if config_path.is_file() else None


def required_share(goal: float, rollout_speedup: float) -> float | None:
    """The rollout share r at which the Amdahl bound reaches `goal` (None: not reachable with this s)."""
    if rollout_speedup <= goal:
        return None
    return (1 - 1 / goal) / (1 - 1 / rollout_speedup)


def row(c: dict) -> list[str]:
    tlt, base = c["tlt"], c["baseline"]
    return [
        c["run"],
        str(c["seed"]),
        f"{c['speedup']:.2f}x",
        f"{c['rollout_speedup']:.2f}x",
        f"{c['rollout_share']:.0%}",
        f"{c['amdahl_bound']:.2f}x",
        f"{c['speedup'] / c['amdahl_bound']:.2f}",
        f"{tlt['step']:.2f} / {base['step']:.2f}",
        f"{tlt['rollout']:.2f} / {base['rollout']:.2f}",
        format_ratio(c["throughput_ratio"]),
        format_ratio(c["run_ratio"]),
        f"{tlt['train']:.2f} / {base['train']:.2f}",
        f"{tlt['accept_length']:.2f}",
        f"{tlt['reward_mean']:.3f} / {base['reward_mean']:.3f}",
        f"{format_percent(tlt['heldout_accuracy'])} / {format_percent(base['heldout_accuracy'])}",
    ]


def report(raw: dict, goal: float) -> str:
    """The Markdown report of `raw` ({"comparisons": one load_comparison per run}) against the step-speedup `goal`."""
    comparisons = raw["comparisons"]
    med = {k: statistics.median(c[k] for c in comparisons) for k in ("speedup", "rollout_speedup", "rollout_share")}
    bound = amdahl_bound(med["rollout_share"], med["rollout_speedup"])
    needed = required_share(goal, med["rollout_speedup"])
    throughputs = [c["throughput_ratio"] for c in comparisons if c["throughput_ratio"] is not None]
    throughput = format_ratio(statistics.median(throughputs) if throughputs else None)
    runs = [c["run_ratio"] for c in comparisons if c["run_ratio"] is not None]
    run_ratio = format_ratio(statistics.median(runs) if runs else None)
    lines = [
        f"# TLT vs baseline over {len(comparisons)} seeds",
        "",
        "Each row is one `tlt train` run with `train.compare_baseline=true` (TLT, then the same run with TLT off); "
        "times are that run's medians over its steps after warm-up.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|",
        *("| " + " | ".join(row(c)) + " |" for c in comparisons),
        "",
        f"- medians over seeds: step ratio **{med['speedup']:.2f}x**, rollout ratio s = {med['rollout_speedup']:.2f}x, "
        f"rollout share r = {med['rollout_share']:.0%}; Amdahl bound at these medians {bound:.2f}x; rollout "
        f"throughput ratio {throughput}; run ratio (all measured steps' seconds) {run_ratio}",
        f"- range over seeds: step {min(c['speedup'] for c in comparisons):.2f}-"
        f"{max(c['speedup'] for c in comparisons):.2f}x, rollout "
        f"{min(c['rollout_speedup'] for c in comparisons):.2f}-{max(c['rollout_speedup'] for c in comparisons):.2f}x",
        *_whole_run_section(comparisons),
        *_accuracy_lines(comparisons),
        f"- a {goal:.2f}x step goal "
        + (
            f"needs r >= {needed:.0%} at s = {med['rollout_speedup']:.2f}x"
            if needed is not None
            else f"is out of reach at s = {med['rollout_speedup']:.2f}x for any r (the bound tends to s as r -> 1)"
        ),
    ]
    return "\n".join(lines) + "\n"


def _whole_run_section(comparisons: list[dict]) -> list[str]:
    """The whole-run table: each seed's summed step and rollout seconds, r, s and the Amdahl bound."""
    columns = ("run", "seed", "run ratio", "rollout s", "r", "Amdahl bound", "of bound")
    runs = [r for r in map(whole_run, comparisons) if r is not None]
    lines = [
        "",
        "Whole run (seconds of all measured steps summed, per arm):",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(columns))) + "|",
        *("| " + " | ".join(whole_run_row(c)) + " |" for c in comparisons),
        "",
    ]
    if runs:
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        lines.append(
            f"- whole run, medians over seeds: **{med[0]:.2f}x** (range {min(r[0] for r in runs):.2f}-"
            f"{max(r[0] for r in runs):.2f}x); rollout s = {med[1]:.2f}x (range {min(r[1] for r in runs):.2f}-"
            f"{max(r[1] for r in runs):.2f}x), r = {med[2]:.0%}, Amdahl bound {med[3]:.2f}x"
        )
    return lines


def _accuracy_lines(comparisons: list[dict]) -> list[str]:
    """Held-out accuracy of the final policies over seeds, against the seed-to-seed spread of each arm."""
    tlt = [c["tlt"]["heldout_accuracy"] for c in comparisons if c["tlt"].get("heldout_accuracy") is not None]
    base = [c["baseline"]["heldout_accuracy"] for c in comparisons if c["baseline"].get("heldout_accuracy") is not None]
    if not tlt or not base:
        return []
    start = sorted({format_percent(c.get("base_heldout_accuracy")) for c in comparisons})
    gap = statistics.median(tlt) - statistics.median(base)
    spread = max(max(tlt) - min(tlt), max(base) - min(base))
    verdict = "within" if abs(gap) <= spread else "outside"
    return [
        f"- held-out accuracy of the final policies: TLT {', '.join(format_percent(a) for a in tlt)} (median "
        f"{format_percent(statistics.median(tlt))}), TLT off {', '.join(format_percent(a) for a in base)} (median "
        f"{format_percent(statistics.median(base))}), starting policy {', '.join(start)}; the medians differ by "
        f"{gap:+.1%}, {verdict} the seed-to-seed spread of either arm ({spread:.1%})"
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="`tlt train` output folders holding speedup.json")
    p.add_argument("--goal", type=float, default=1.8, help="step-speedup goal to size r against (default 1.8)")
    p.add_argument("--out", help="also write the report here (markdown), and its raw data next to it (.json)")
    p.add_argument("--from-json", help="render the report from raw data written by an earlier --out")
    args = p.parse_args(argv)
    if args.goal <= 1:
        p.error(f"--goal must be > 1, got {args.goal}")
    if bool(args.runs) == bool(args.from_json):
        p.error("give run folders or --from-json, not both")
    try:
        if args.from_json:
            raw = json.loads(Path(args.from_json).read_text())
        else:
            raw = {"comparisons": [load_comparison(run) for run in args.runs]}
    except FileNotFoundError as err:
        print(f"speedup_seeds: error: {err}", file=sys.stderr)
        return 2
    render = partial(report, goal=args.goal)
    print(write_report(args.out, raw, render) if args.out else render(raw), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

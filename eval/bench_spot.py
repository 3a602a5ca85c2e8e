"""Spot drafter training overhead: the same multi-process `tlt train` run under scheduler.policy = never, spot
and between_steps.

`spot` trains the drafter on ranks whose rollout share is done while the others still decode (the long-tail
wait); `between_steps` trains `scheduler.between_steps_budget` micro-steps after the rollout (time added to the
step); `never` keeps it frozen. Reported per policy, medians over the steps after the first: rollout seconds
(spot must not slow the rollout down: goal within 3% of never), step seconds, drafter micro-steps per RL step,
idle seconds (ranks waiting for the last share) and the part of it spent training; and the paired rollout
ratio to never (median of per-step ratios at the same round and step: with SD off in the engine, every run
decodes the same rollouts), per round and as a mean over rounds with its 95% t-interval. Runs go one after
another (each spawns its own ranks), `--rounds` times; round k starts the policy order at its k-th policy, so
over a multiple of 3 rounds every policy runs equally often first, second and third (a machine that slows
down, or warms up, within a round biases no policy).

A policy may carry overrides of its own after a `+`: `--policies never,spot,spot+drafter.precision=bf16-mixed`
compares spot training in float32 and in bf16 against never in the same rounds.

  OMP_NUM_THREADS=1 python -m eval.bench_spot --config configs/tlt.yaml --steps 8 --rounds 2 --out runs/bench-spot \
      train.devices=2 drafter.path=runs/quickstart/drafter
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tlt.eval.train_runs import train_metrics
from tlt.files import write_report
from tlt.machine import describe_machine

POLICIES = ("never", "spot", "between_steps")
PARTS = ("rollout_seconds", "train_seconds", "drafter_seconds", "push_seconds")


def run_policy(args, policy: str, round_: int) -> list[dict]:
    """One `tlt train` run of `policy` ("spot", or "spot+key=value+..." with overrides of its own)."""
    name, *extra = policy.split("+")
    out = Path(args.out) / f"{policy.replace('=', '-').replace('+', '_')}-{round_}"
    return train_metrics(args.config, out, args.steps, [f"scheduler.policy={name}", *args.overrides, *extra])


def summarize(rows: list[dict]) -> dict:
    def med(key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    return {
        "rollout_seconds": med("rollout_seconds"),
        "step_seconds": statistics.median(sum(float(r[p]) for p in PARTS) for r in rows),
        "drafter_seconds": med("drafter_seconds"),
        "drafter_steps": med("drafter_steps"),
        "spot_steps": med("spot_steps"),
        "idle_seconds": med("idle_seconds"),
        "idle_train_seconds": med("idle_train_seconds"),
        "accept_length": med("accept_length"),
        "steps": len(rows),
    }


def step_ratios(runs: dict[str, list[list[dict]]]) -> dict[str, list[list[float]]]:
    """Per policy, round and step: its rollout seconds over never's at the same round and step."""
    return {
        policy: [
            [
                float(row["rollout_seconds"]) / float(base["rollout_seconds"])
                for row, base in zip(rows, base_rows, strict=True)
            ]
            for rows, base_rows in zip(per_round, runs["never"], strict=True)
        ]
        for policy, per_round in runs.items()
    }


def paired_rollout_ratios(runs: dict[str, list[list[dict]]]) -> dict[str, float]:
    """Per policy: the median over rounds and steps of its rollout seconds over never's at the same round and
    step. With the engine's SD off (speculative.tuner=off) every run decodes the same rollouts, so each ratio
    compares one rollout with itself and a slow phase of the machine that hits one run shows as one round."""
    return {
        policy: statistics.median(r for ratios in rounds for r in ratios)
        for policy, rounds in step_ratios(runs).items()
    }


def round_order(policies: list[str], round_: int) -> list[str]:
    """The policies of round `round_`, rotated to start at its (round_ mod n)-th."""
    k = round_ % len(policies)
    return policies[k:] + policies[:k]


def round_ratios(runs: dict[str, list[list[dict]]]) -> dict[str, list[float]]:
    """Per policy and round: the median over steps of its rollout seconds over never's at the same step."""
    return {policy: [statistics.median(ratios) for ratios in rounds] for policy, rounds in step_ratios(runs).items()}


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its two-sided t-interval (nan bounds for one value)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf((1 + level) / 2, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def render(report: dict) -> str:
    s, rows = report["settings"], report["policies"]
    never = rows["never"]["rollout_seconds"]
    lines = [
        "# Spot drafter training: overhead and idle time used",
        "",
        f"`tlt train {s['config']} {' '.join(s['overrides'])}` with {s['steps']} steps per run, {s['rounds']} "
        "round(s) of the policies in turn (order rotated each round); medians over all steps after each run's first.",
        "",
        "| policy | rollout s | vs never | paired vs never | step s | drafter s | drafter steps / RL step | "
        "spot steps | idle s | idle s training | accept length |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    paired = report.get("paired_rollout_ratios", {})
    for name, r in rows.items():
        ratio = f"{paired[name] - 1:+.1%}" if name in paired else "-"
        lines.append(
            f"| {name} | {r['rollout_seconds']:.2f} | {r['rollout_seconds'] / never - 1:+.1%} | {ratio} | "
            f"{r['step_seconds']:.2f} | {r['drafter_seconds']:.2f} | {r['drafter_steps']:.0f} | "
            f"{r['spot_steps']:.0f} | {r['idle_seconds']:.2f} | {r['idle_train_seconds']:.2f} | "
            f"{r['accept_length']:.2f} |"
        )
    if paired:
        lines += [
            "",
            "Paired: median over rounds and steps of (rollout s / never's at the same round and step).",
        ]
    for name, ratios in report.get("round_ratios", {}).items():
        if name == "never":
            continue
        mean, low, high = mean_interval(ratios)
        per_round = ", ".join(f"{r - 1:+.1%}" for r in ratios)
        lines.append(
            f"- {name} vs never, paired per round: {per_round}; mean {mean - 1:+.1%} "
            f"(95% t-interval {low - 1:+.1%} to {high - 1:+.1%})"
        )
    for name, per_round in report.get("rounds", {}).items():
        medians = ", ".join(f"{statistics.median(float(r['rollout_seconds']) for r in rs):.2f}" for rs in per_round)
        lines.append(f"- {name}: median rollout s per round {medians}")
    lines += ["", "Machine: " + json.dumps(report["machine"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tlt.yaml")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (e.g. train.devices=2)")
    args = p.parse_args(argv)
    policies = args.policies.split(",")
    runs: dict[str, list[list[dict]]] = {policy: [] for policy in policies}
    for round_ in range(args.rounds):
        for policy in round_order(policies, round_):
            runs[policy].append(run_policy(args, policy, round_))
    report = {
        "settings": vars(args),
        "machine": describe_machine(),
        "policies": {policy: summarize([r for rs in per_round for r in rs]) for policy, per_round in runs.items()},
        "rounds": runs,
    }
    if "never" in runs:
        report["paired_rollout_ratios"] = paired_rollout_ratios(runs)
        report["round_ratios"] = round_ratios(runs)
    print(write_report(Path(args.out) / "spot.md", report, render))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The target's weights in oneDNN's packed layout against F.linear over the shared weights, on CPU.

`tlt.models.lean.Linear` multiplies a CPU target's projections by packed copies of its weights (one-token inputs
by the shared weight, F.linear's matrix-vector product). This measures what that changes, each arm pair taking
turns in rotated order over `--rounds` rounds:

1. Target forward costs t(b, N): one forward of N chained tokens per row over a filled cache of `--cache-len`
   (`tlt.eval.bench.sd.costs.forward_seconds`), per batch size b and N, packed and F.linear; the median over
   rounds of each one's median over `--reps` calls. t(b, N) / t(b, 1) is what a verify of N tokens costs in
   plain steps: SD pays when the tokens per verify exceed it (plus the draft's cost).
2. Decoding: arms `plain` and `sd` (SD at `--strategy` on every step), each with packed weights and with
   F.linear. Each call decodes one held-out prompt with `b` samples (a GRPO group) at T = 1, b in `--batches`.
   The SD drafter is `suffix` (its history: a first pass of 8 samples per prompt, the prompts' next RL epoch) or
   a saved drafter folder (EAGLE: sampled chains). Every arm decodes the same prompts with the same seeds in a
   round. Reported per batch and arm: tokens/s over all rounds, the median (min-max) over rounds of its tokens/s
   over `plain` with F.linear, and tokens per verify (accepted + 1, per row and SD step).

  OMP_NUM_THREADS=1 python -m eval.bench_packed --target runs/tiny/model --out eval/results/packed_tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

from tlt.backends.native import NativeEngine
from tlt.eval.bench.passes import (
    add_forward_cost_args,
    add_sd_batch_args,
    bench_drafter,
    group_decoding,
    measure,
    packable_policy,
    rotated,
)
from tlt.eval.bench.sd.costs import forward_seconds
from tlt.machine import describe_machine
from tlt.models.lean import LeanModel
from tlt.schedulers.tuners.base import FixedTuner
from tlt.speculative.strategy import SpecStrategy

WEIGHTS = ("linear", "packed")


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sd_batch_args(parser, rounds=5)
    add_forward_cost_args(parser)
    args = parser.parse_args(argv)
    SpecStrategy.parse(args.strategy)  # a malformed strategy stops here, naming itself
    if 1 not in args.new_tokens:
        parser.error("--new-tokens must include 1 (the plain step every cost is compared with)")
    return args


def forward_costs(model, args) -> list[dict]:
    """Per round, per (b, N): seconds of one forward with F.linear and with packed weights (rotated order)."""
    leans = {"linear": LeanModel.from_hf(model, packed=False), "packed": LeanModel.from_hf(model)}
    rounds = []
    for round_ in range(args.rounds):
        cells = {}
        for b in args.cost_batches:
            for n in args.new_tokens:
                length = min(args.cache_len, leans["linear"].max_positions - n)
                cells[f"{b}x{n}"] = {
                    w: forward_seconds(leans[w], b, n, length, args.reps) for w in rotated(WEIGHTS, round_)
                }
        rounds.append(cells)
        print(f"[bench_packed] forward costs, round {round_ + 1}/{args.rounds}", file=sys.stderr)
    return rounds


def _engine(model, args, arm: str, eos: int, max_seq_len: int, history) -> NativeEngine:
    mode, weights = arm.split("/")
    packed = weights == "packed"
    if mode == "plain":
        return NativeEngine(model, eos, max_seq_len, packed_weights=packed)
    drafter = bench_drafter(args.drafter, history)
    tuner = FixedTuner(args.strategy, threshold=1 << 30)
    return NativeEngine(model, eos, max_seq_len, tuner=tuner, drafter=drafter, packed_weights=packed)


def decoding(model, tokenizer, args) -> list[dict]:
    """Per round, per batch: each arm's sums over the prompts (rotated order, the same seeds)."""
    arms = [f"{mode}/{kind}" for mode in ("plain", "sd") for kind in WEIGHTS]
    return group_decoding(model, tokenizer, args, arms, partial(_engine, model, args), "bench_packed")


def run(args) -> dict:
    model, tokenizer = packable_policy(args.target)
    return {
        "machine": describe_machine(),
        "settings": vars(args),
        "forward_costs": forward_costs(model, args),
        "decoding": decoding(model, tokenizer, args),
    }


def summarize_costs(report: dict) -> list[dict]:
    rounds = report["forward_costs"]

    def median(cell: str, weights: str) -> float:
        return statistics.median(r[cell][weights] for r in rounds)

    rows = []
    for cell in sorted(rounds[0], key=lambda c: tuple(map(int, c.split("x")))):  # the JSON keeps keys sorted as text
        b, n = cell.split("x")
        one = f"{b}x1"
        rows.append(
            {
                "batch": int(b),
                "new_tokens": int(n),
                **{f"{w}_ms": 1e3 * median(cell, w) for w in WEIGHTS},
                **{f"{w}_per_step": median(cell, w) / median(one, w) for w in WEIGHTS},
                "speedup": statistics.median(r[cell]["linear"] / r[cell]["packed"] for r in rounds),
            }
        )
    return rows


def summarize_decoding(report: dict) -> list[dict]:
    rounds = report["decoding"]
    rows = []
    for batch in sorted(rounds[0], key=int):
        arms = rounds[0][batch]
        base = [r[batch]["plain/linear"]["tokens"] / r[batch]["plain/linear"]["seconds"] for r in rounds]
        for arm in arms:
            runs = [r[batch][arm] for r in rounds]
            ratios = [x["tokens"] / x["seconds"] / b for x, b in zip(runs, base, strict=True)]
            verifies = sum(x["sd_verifies"] for x in runs)
            rows.append(
                {
                    "batch": int(batch),
                    "arm": arm,
                    "tokens_per_second": sum(x["tokens"] for x in runs) / sum(x["seconds"] for x in runs),
                    "ratio_median": statistics.median(ratios),
                    "ratio_range": (min(ratios), max(ratios)),
                    "tokens_per_verify": sum(x["sd_tokens"] for x in runs) / verifies if verifies else None,
                }
            )
    return rows


def table(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    target = "/".join(Path(s["target"]).parts[-2:])
    drafter = "suffix (history: 8 first-pass samples per prompt)" if s["drafter"] == "suffix" else s["drafter"]
    lines = [
        f"# Packed weights (oneDNN layout) against F.linear on the shared weights ({target})",
        "",
        f"Machine: {m.get('cpu_model')}, torch threads {m.get('torch_threads')}. {s['rounds']} rounds, the two "
        "weight layouts (and the decoding arms) in rotated order. Written by eval/bench_packed.py from packed.json.",
        "",
        f"## Target forward costs: N chained tokens per row over {s['cache_len']} cached tokens",
        "",
        f"Median over rounds of each round's median of {s['reps']} forwards. Per step: t(b, N) / t(b, 1), what a "
        "verify of N tokens costs in plain steps with the same weights.",
        "",
        "| b | N | F.linear ms | packed ms | packed speedup (median of rounds) | per step, F.linear | "
        "per step, packed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summarize_costs(report):
        lines.append(
            f"| {r['batch']} | {r['new_tokens']} | {r['linear_ms']:.2f} | {r['packed_ms']:.2f} | {r['speedup']:.2f}x "
            f"| {r['linear_per_step']:.2f} | {r['packed_per_step']:.2f} |"
        )
    lines += [
        "",
        f"## Decoding: one prompt with b samples per call, T = 1, {s['prompts']} held-out prompts, up to "
        f"{s['max_new_tokens']} tokens",
        "",
        f"`sd`: SD at {s['strategy']} on every step, drafter {drafter}. Ratio: per round, tokens/s over "
        "`plain/linear`'s.",
        "",
        "| b | arm | tokens/s | vs plain/linear, per round: median (min-max) | tokens per verify (per row) |",
        "|---|---|---|---|---|",
    ]
    for r in summarize_decoding(report):
        low, high = r["ratio_range"]
        per_verify = "-" if r["tokens_per_verify"] is None else f"{r['tokens_per_verify']:.2f}"
        lines.append(
            f"| {r['batch']} | {r['arm']} | {r['tokens_per_second']:.0f} | {r['ratio_median']:.2f}x "
            f"({low:.2f}-{high:.2f}x) | {per_verify} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "packed.md")


if __name__ == "__main__":
    sys.exit(main())

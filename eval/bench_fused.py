"""Stacked projections against one product per projection, on CPU with packed weights.

`tlt.models.lean.FusedLinear` multiplies a layer's q, k and v (and its gate and up) by one packed copy of their
stacked weights and splits the output, where each used to be its own product (one-token inputs keep each
projection's F.linear either way). This measures what that changes, the two kinds (`stacked`, the engine's
default, and `apart`) taking turns in rotated order over `--rounds` rounds:

1. Target forward costs t(b, N): one forward of N chained tokens per row over a filled cache of `--cache-len`
   (`tlt.eval.bench.sd.costs.forward_seconds`), per batch size b and N; the median over rounds of each one's
   median over `--reps` calls, and the median (min-max) over rounds of apart / stacked.
2. Decoding: arms `plain` and `sd` (SD at `--strategy` on every step), each stacked and apart. Each call decodes
   one held-out prompt with `b` samples at T = 1, b in `--batches`; every arm decodes the same prompts with the
   same seeds in a round. The SD drafter is `suffix` (its history: a first pass of 8 samples per prompt) or a
   saved drafter folder. Reported per batch and arm: tokens/s over all rounds, the median (min-max) over rounds of
   its tokens/s over `plain/apart`'s, and tokens per verify (accepted + 1, per row).

  OMP_NUM_THREADS=1 python -m eval.bench_fused --target runs/tiny/model --out eval/results/fused_tiny
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

KINDS = ("apart", "stacked")


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sd_batch_args(parser, rounds=4)  # 4 decoding arms: every arm in every position
    add_forward_cost_args(parser)
    args = parser.parse_args(argv)
    SpecStrategy.parse(args.strategy)  # a malformed strategy stops here, naming itself
    return args


def forward_costs(model, args) -> list[dict]:
    """Per round, per (b, N): seconds of one forward, stacked and apart (rotated order)."""
    leans = {kind: LeanModel.from_hf(model, stacked=kind == "stacked") for kind in KINDS}
    rounds = []
    for round_ in range(args.rounds):
        cells = {}
        for b in args.cost_batches:
            for n in args.new_tokens:
                length = min(args.cache_len, leans["apart"].max_positions - n)
                cells[f"{b}x{n}"] = {
                    k: forward_seconds(leans[k], b, n, length, args.reps) for k in rotated(KINDS, round_)
                }
        rounds.append(cells)
        print(f"[bench_fused] forward costs, round {round_ + 1}/{args.rounds}", file=sys.stderr)
    return rounds


def _engine(model, args, arm: str, eos: int, max_seq_len: int, history) -> NativeEngine:
    mode, kind = arm.split("/")
    if mode == "plain":
        engine = NativeEngine(model, eos, max_seq_len)
    else:
        tuner = FixedTuner(args.strategy, threshold=1 << 30)
        engine = NativeEngine(model, eos, max_seq_len, tuner=tuner, drafter=bench_drafter(args.drafter, history))
    if kind == "apart":  # the same engine over a forward with one product per projection
        engine.runner.lean = LeanModel.from_hf(engine.model, stacked=False)
    return engine


def decoding(model, tokenizer, args) -> list[dict]:
    """Per round, per batch: each arm's sums over the prompts (rotated order, the same seeds)."""
    arms = [f"{mode}/{kind}" for mode in ("plain", "sd") for kind in KINDS]
    return group_decoding(model, tokenizer, args, arms, partial(_engine, model, args), "bench_fused")


def run(args) -> dict:
    model, tokenizer = packable_policy(args.target)
    return {
        "machine": describe_machine(),
        "settings": vars(args),
        "forward_costs": forward_costs(model, args),
        "decoding": decoding(model, tokenizer, args),
    }


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarize(report: dict) -> dict[str, list[dict]]:
    costs = report["forward_costs"]
    cost_rows = [
        {
            "cell": cell,
            **{f"{k}_ms": 1e3 * statistics.median(r[cell][k] for r in costs) for k in KINDS},
            "speedup": _spread([r[cell]["apart"] / r[cell]["stacked"] for r in costs]),
        }
        for cell in sorted(costs[0], key=lambda c: tuple(map(int, c.split("x"))))  # JSON keys sort as text
    ]
    runs = report["decoding"]
    decode_rows = []
    for batch in sorted(runs[0], key=int):
        base = [r[batch]["plain/apart"]["tokens"] / r[batch]["plain/apart"]["seconds"] for r in runs]
        for arm in runs[0][batch]:
            cells = [r[batch][arm] for r in runs]
            verifies = sum(c["sd_verifies"] for c in cells)
            decode_rows.append(
                {
                    "batch": batch,
                    "arm": arm,
                    "tokens_per_second": sum(c["tokens"] for c in cells) / sum(c["seconds"] for c in cells),
                    "ratio": _spread([c["tokens"] / c["seconds"] / b for c, b in zip(cells, base, strict=True)]),
                    "tokens_per_verify": sum(c["sd_tokens"] for c in cells) / verifies if verifies else None,
                }
            )
    return {"costs": cost_rows, "decoding": decode_rows}


def table(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    rows = summarize(report)
    target = "/".join(Path(s["target"]).parts[-2:])
    lines = [
        f"# Stacked projections (q/k/v, gate/up) against one product per projection, packed weights ({target})",
        "",
        f"Machine: {m.get('cpu_model')}, torch threads {m.get('torch_threads')}. {s['rounds']} rounds, the kinds "
        "(and the decoding arms) in rotated order. Written by eval/bench_fused.py from fused.json.",
        "",
        f"## Target forward costs: N chained tokens per row over {s['cache_len']} cached tokens",
        "",
        f"Median over rounds of each round's median of {s['reps']} forwards; speedup: apart / stacked per round.",
        "",
        "| b x N | apart ms | stacked ms | speedup, median (min-max) over rounds |",
        "|---|---|---|---|",
    ]
    for r in rows["costs"]:
        mid, low, high = r["speedup"]
        lines.append(
            f"| {r['cell']} | {r['apart_ms']:.2f} | {r['stacked_ms']:.2f} | {mid:.2f}x ({low:.2f}-{high:.2f}x) |"
        )
    drafter = "suffix (history: 8 first-pass samples per prompt)" if s["drafter"] == "suffix" else s["drafter"]
    lines += [
        "",
        f"## Decoding: one prompt with b samples per call, T = 1, {s['prompts']} held-out prompts, up to "
        f"{s['max_new_tokens']} tokens",
        "",
        f"`sd`: SD at {s['strategy']} on every step, drafter {drafter}. Ratio: per round, tokens/s over "
        "`plain/apart`'s.",
        "",
        "| b | arm | tokens/s | vs plain/apart, per round: median (min-max) | tokens per verify (per row) |",
        "|---|---|---|---|---|",
    ]
    for r in rows["decoding"]:
        mid, low, high = r["ratio"]
        per_verify = "-" if r["tokens_per_verify"] is None else f"{r['tokens_per_verify']:.2f}"
        lines.append(
            f"| {r['batch']} | {r['arm']} | {r['tokens_per_second']:.0f} | {mid:.2f}x ({low:.2f}-{high:.2f}x) "
            f"| {per_verify} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "fused.md")


if __name__ == "__main__":
    sys.exit(main())

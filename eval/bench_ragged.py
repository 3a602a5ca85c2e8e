"""Ragged verification of the suffix drafter's drafts against verifying them padded, through the engine.

A model-free drafter drafts as far as its history allows: often nothing, often a token or two, sometimes a long
run. Its tree says how many nodes each row drafted (`DraftTree.real`); the native engine then verifies only as
wide as the step's longest draft, the target computing the drafted nodes alone, and runs a plain step when no row
drafted anything. Before, every row was verified at the strategy's full width, filler included. This benchmark
measures what that is worth, and where SD with the suffix drafter still loses, on GRPO-style rollouts: `--group`
prompts x `--samples` samples per generate() call (one RL rank's share of a step), T = 1, two passes over the same
prompts (pass 2: another seed, the drafter keeping pass 1's responses, the prompts' next RL epoch).

Arms: `plain` (no SD); `padded` (SD at `--strategy` on every step, the drafter's per-row draft lengths dropped: the
engine before ragged verification); `ragged` (the same, lengths kept); `ragged_cost` (the cost-model tuner over
`--strategies`, choosing SD or plain per batch size). Every arm starts from a fresh drafter; arms take turns in
rotated order; each round samples its own set (seeds 2r + 1, 2r + 2), as a pass's time follows its longest
response. Reported per pass and arm: tokens/s (sums over rounds), its ratio to `plain` (and the median over rounds
of the per-round ratio), tokens per verify (accepted + 1 per SD row-verify), drafted nodes per SD row-verify, the
SD share of tokens; and per running-batch-size bucket, tokens/s of the decode steps in it (prefill excluded) and
the share of them decoded with SD.

  OMP_NUM_THREADS=1 python -m eval.bench_ragged --target runs/tiny/model --out eval/results/ragged_tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.bench.passes import measure, sd_sums, tokens_per_second, two_pass_rounds
from tlt.eval.heldout import heldout_prompt_ids
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners import build_tuner

ARMS = ("plain", "padded", "ragged", "ragged_cost")
BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 1 << 30))  # running batch sizes, inclusive


class PaddedSuffixDrafter(SuffixDrafter):
    """The suffix drafter without its per-row draft lengths: the engine verifies every node of the strategy."""

    def propose_scored(self, strategy):
        scored = super().propose_scored(strategy)
        scored.tree.real = None
        return scored


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    parser.add_argument("--group", type=int, default=2, help="prompts per generate() call")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=768)
    parser.add_argument("--strategy", default="5_1_6", help="the padded and ragged arms' strategy")
    parser.add_argument("--strategies", default="3_1_4,5_1_6", help="the ragged_cost arm's tuner strategies")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _engine(arm: str, model, eos: int, max_seq_len: int, args) -> NativeEngine:
    if arm == "plain":
        return NativeEngine(model, eos, max_seq_len)
    if arm == "ragged_cost":
        tuner = build_tuner("cost", args.strategies.split(","), seed=0)
    else:
        tuner = build_tuner("fixed", [args.strategy], seed=0, threshold=1 << 30)
    drafter = PaddedSuffixDrafter() if arm == "padded" else SuffixDrafter()
    return NativeEngine(model, eos, max_seq_len, tuner=tuner, drafter=drafter)


def _bucket(size: int) -> str:
    low, high = next(b for b in BUCKETS if b[0] <= size <= b[1])
    return str(low) if low == high else f"{low}+" if high == 1 << 30 else f"{low}-{high}"


def _pass(engine: NativeEngine, prompts, args, sampling: SamplingParams) -> dict:
    """One pass over the prompts, `args.group` at a time: sums over its generate() calls."""
    result = dict.fromkeys(("seconds", "tokens", *sd_sums([])), 0)
    buckets: dict[str, list[float]] = {}  # bucket -> [tokens, seconds, SD tokens]
    for start in range(0, len(prompts), args.group):
        clock = time.perf_counter()
        rollouts = engine.generate(prompts[start : start + args.group], sampling, n=args.samples)
        result["seconds"] += time.perf_counter() - clock
        result["tokens"] += sum(r.token_ids.numel() for r in rollouts)
        for key, value in sd_sums(engine.step_stats).items():
            result[key] += value
        for step in engine.step_stats:
            totals = buckets.setdefault(_bucket(step.running_batch), [0, 0.0, 0])
            totals[0] += step.generated_tokens
            totals[1] += step.seconds
            totals[2] += step.generated_tokens if step.sd_on else 0
    return result | {"buckets": buckets}


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target)
    prompts = heldout_prompt_ids(tokenizer, args.prompts)
    max_seq_len = max(map(len, prompts)) + args.max_new_tokens
    rounds = two_pass_rounds(
        ARMS,
        args.rounds,
        lambda arm: _engine(arm, model, tokenizer.eos_token_id, max_seq_len, args),
        lambda engine, sampling: _pass(engine, prompts, args, sampling),
        args.max_new_tokens,
        "bench_ragged",
    )
    return {"machine": describe_machine(), "settings": vars(args), "rounds": rounds}


def summarize(report: dict) -> list[dict]:
    """Per pass and arm: sums over rounds, the median per-round ratio to plain, and the buckets."""
    rows = []
    for number in range(2):
        plain = [r["plain"][number] for r in report["rounds"]]
        plain_rate = tokens_per_second({k: sum(x[k] for x in plain) for k in ("tokens", "seconds")})
        for arm in ARMS:
            runs = [r[arm][number] for r in report["rounds"]]
            total = {key: sum(x[key] for x in runs) for key in runs[0] if key != "buckets"}
            buckets = {}
            for run in runs:
                for name, values in run["buckets"].items():
                    buckets[name] = [a + b for a, b in zip(buckets.get(name, [0, 0.0, 0]), values, strict=True)]
            verifies = max(total["sd_verifies"], 1)
            ratios = [tokens_per_second(x) / tokens_per_second(p) for x, p in zip(runs, plain, strict=True)]
            rows.append(
                {
                    "pass": number + 1,
                    "arm": arm,
                    "seconds": total["seconds"],
                    "tokens": total["tokens"],
                    "tokens_per_second": tokens_per_second(total),
                    "vs_plain": tokens_per_second(total) / plain_rate,
                    "vs_plain_median": statistics.median(ratios),
                    "vs_plain_range": [min(ratios), max(ratios)],
                    "tokens_per_verify": total["accepted"] / verifies + 1 if total["sd_verifies"] else 0.0,
                    "drafted_per_verify": total["drafted"] / verifies,
                    "sd_share": total["sd_tokens"] / total["tokens"],
                    "buckets": {
                        name: {"tokens_per_second": t / s, "sd_share": sd / t} for name, (t, s, sd) in buckets.items()
                    },
                }
            )
    return rows


def _bucket_order(name: str) -> int:
    return int(name.split("-")[0].rstrip("+"))


def table(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    rows = summarize(report)
    lines = [
        f"# The suffix drafter through the engine: ragged vs padded verification ({s['target']})",
        "",
        f"{s['prompts']} held-out prompts, {s['group']} per generate() call x {s['samples']} samples, T = 1, up to "
        f"{s['max_new_tokens']} tokens, native engine, one process; padded / ragged: SD at {s['strategy']} on every "
        f"step; ragged_cost: the cost-model tuner over {s['strategies']}. Pass 2: the same prompts with another seed "
        f"(the drafter keeps pass 1). {s['rounds']} rounds, each its own sample set, arms in rotated order; sums over "
        "rounds, and the median (min-max) over rounds of the per-round tokens/s ratio to plain. Machine: "
        f"{m.get('cpu_model')}, torch threads {m.get('torch_threads')}. Written by eval/bench_ragged.py from "
        "ragged.json.",
        "",
        "| pass | arm | seconds | tokens | tokens/s | vs plain | per round: median (min-max) | tokens per verify | "
        "drafted per verify | SD share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["vs_plain_range"]
        lines.append(
            f"| {r['pass']} | {r['arm']} | {r['seconds']:.1f} | {r['tokens']} | {r['tokens_per_second']:.0f} | "
            f"{r['vs_plain']:.2f}x | {r['vs_plain_median']:.2f}x ({low:.2f}-{high:.2f}) | "
            f"{r['tokens_per_verify']:.2f} | {r['drafted_per_verify']:.2f} | {r['sd_share']:.0%} |"
        )
    names = sorted({name for r in rows for name in r["buckets"]}, key=_bucket_order)
    lines += [
        "",
        "Decode steps by running batch size: tokens/s of the steps in each bucket (its ratio to plain's), and the "
        "share of their tokens decoded with SD.",
        "",
        "| pass | arm | " + " | ".join(f"batch {n}" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    plain = {r["pass"]: r["buckets"] for r in rows if r["arm"] == "plain"}
    for r in rows:
        cells = []
        for name in names:
            b, p = r["buckets"].get(name), plain[r["pass"]].get(name)
            if b is None:
                cells.append("-")
            elif r["arm"] == "plain" or p is None:
                cells.append(f"{b['tokens_per_second']:.0f}")
            else:
                ratio = b["tokens_per_second"] / p["tokens_per_second"]
                cells.append(f"{b['tokens_per_second']:.0f} ({ratio:.2f}x, SD {b['sd_share']:.0%})")
        lines.append(f"| {r['pass']} | {r['arm']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "ragged.md")


if __name__ == "__main__":
    sys.exit(main())

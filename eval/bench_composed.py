"""EAGLE alone against EAGLE composed with the suffix drafter (`tlt.drafters.composed`), through the engine.

The same GRPO-style rollouts as the RL step makes them (n samples per prompt, T = 1, the cost-model tuner over
the main job's strategies, SD where it pays), decoded by the native engine with each arm's drafter: `eagle`
(the offline drafter alone), `composed` (the same drafter plus the suffix drafter, chosen per row and step), and
`plain` (no SD) as the reference. Each arm runs two passes over the same prompts: pass 1 with prompts new to it,
pass 2 with another seed, the suffix history keeping pass 1 (the prompts' next RL epoch). Arms take turns within
a round (order rotated each round; every arm starts from a fresh drafter copy and tuner), over `--rounds` rounds.

At T = 1 the arms sample different responses (lossless SD keeps the distribution, not the draws), and a pass's
time follows its longest response, so one sample set says little: round r samples its own set (seeds 2r + 1 and
2r + 2 for its two passes). Reported per pass and arm, over all rounds: tokens per second (summed tokens over
summed seconds) and its ratio to `eagle`'s, the median of the per-round time ratios, accepted draft tokens per SD
verify and row, the share of tokens decoded with SD, and for `composed` the share of SD verifies the suffix
drafter drafted and the accepted tokens per verify of each part.

  OMP_NUM_THREADS=1 python -m eval.bench_composed --target tlt/assets/deep_v2/policy \
      --drafter tlt/assets/deep_v2/drafter --out eval/results/composed_deep_v1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters import load_drafter
from tlt.drafters.composed import ComposedDrafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.bench.passes import measure, sd_sums, tokens_per_second, two_pass_rounds
from tlt.eval.heldout import heldout_prompt_ids
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners import build_tuner

ARMS = ("plain", "eagle", "composed")


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--drafter", required=True, help="saved EAGLE drafter folder")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--tuner", default="cost", help="tuner kind (cost, fixed, ...)")
    parser.add_argument("--strategies", default="3_1_4,5_1_6,7_1_8", help="the tuner's strategies")
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="0: greedy, every arm decodes the same tokens, so the times compare exactly (pass 2 then finds pass "
        "1's responses in the suffix history, a best case for it)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _engine(arm: str, model, eos: int, max_seq_len: int, eagle, args) -> NativeEngine:
    if arm == "plain":
        return NativeEngine(model, eos, max_seq_len)
    drafter = eagle.clone() if arm == "eagle" else ComposedDrafter(eagle.clone(), SuffixDrafter())
    extra = {"threshold": 10**6} if args.tuner == "fixed" else {}
    tuner = build_tuner(args.tuner, args.strategies.split(","), seed=0, **extra)
    return NativeEngine(model, eos, max_seq_len, tuner=tuner, drafter=drafter)


def _pass(engine: NativeEngine, prompts, n: int, sampling: SamplingParams) -> dict:
    start = time.perf_counter()
    rollouts = engine.generate(prompts, sampling, n=n)
    seconds = time.perf_counter() - start
    result = {
        "seconds": seconds,
        "tokens": sum(r.token_ids.numel() for r in rollouts),
        "longest": max(r.token_ids.numel() for r in rollouts),
        **sd_sums(engine.step_stats),
    }
    drafter = engine.drafter
    if isinstance(drafter, ComposedDrafter):
        result["attribution"] = drafter.take_attribution()  # this pass's
    return result


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target)
    prompts = heldout_prompt_ids(tokenizer, args.prompts)
    max_seq_len = max(map(len, prompts)) + args.max_new_tokens
    eagle = load_drafter(args.drafter)
    rounds = two_pass_rounds(
        ARMS,
        args.rounds,
        lambda arm: _engine(arm, model, tokenizer.eos_token_id, max_seq_len, eagle, args),
        lambda engine, sampling: _pass(engine, prompts, args.samples, sampling),
        args.max_new_tokens,
        "bench_composed",
        args.temperature,
    )
    return {"machine": describe_machine(), "settings": vars(args), "rounds": rounds}


SUMMED = ("seconds", "tokens", "sd_verifies", "accepted", "sd_tokens")


def _totals(runs: list[dict]) -> dict:
    return {key: sum(x[key] for x in runs) for key in SUMMED}


def time_ratios(report: dict, arm: str, number: int) -> list[float]:
    """Per round, eagle's seconds over the arm's in pass `number` (0 or 1): > 1 is faster than EAGLE alone."""
    return [r["eagle"][number]["seconds"] / r[arm][number]["seconds"] for r in report["rounds"]]


def summarize(report: dict) -> list[dict]:
    """Per pass and arm: the sums over rounds (and the median time ratio) the table shows."""
    rows = []
    rounds = report["rounds"]
    for number in range(2):
        eagle = [r["eagle"][number] for r in rounds]
        eagle_rate = tokens_per_second(_totals(eagle))
        for arm in ARMS:
            runs = [r[arm][number] for r in rounds]
            total = _totals(runs)
            row = {
                "pass": number + 1,
                "arm": arm,
                "seconds": total["seconds"],
                "tokens": total["tokens"],
                "tokens_per_second": tokens_per_second(total),
                "vs_eagle": tokens_per_second(total) / eagle_rate,
                "time_ratios": time_ratios(report, arm, number),
                "accepted_per_verify": total["accepted"] / max(total["sd_verifies"], 1),
                "sd_share": total["sd_tokens"] / total["tokens"],
            }
            if arm == "composed":
                parts = {
                    s: {k: sum(x["attribution"][s][k] for x in runs) for k in ("verifies", "accepted")}
                    for s in ("learned", "suffix")
                }
                verifies = parts["suffix"]["verifies"] + parts["learned"]["verifies"]
                row["suffix_share"] = parts["suffix"]["verifies"] / max(verifies, 1)
                row["suffix_accepted"] = parts["suffix"]["accepted"] / max(parts["suffix"]["verifies"], 1)
                row["learned_accepted"] = parts["learned"]["accepted"] / max(parts["learned"]["verifies"], 1)
            rows.append(row)
    return rows


def table(report: dict) -> str:
    s = report["settings"]
    m = report["machine"]
    lines = [
        f"# EAGLE alone vs EAGLE + suffix drafter, composed per row ({Path(s['target']).name})",
        "",
        f"{s['prompts']} held-out prompts x {s['samples']} samples, T = {s.get('temperature', 1.0):g}, up to "
        f"{s['max_new_tokens']} tokens, "
        f"tuner `{s['tuner']}` over {s['strategies']}, native engine, one process; pass 2: the same prompts with "
        f"another seed (the suffix history keeps pass 1). {s['rounds']} rounds, each its own sample set (seeds "
        "2r + 1, 2r + 2), arms in rotated order; sums over rounds (tokens/s vs eagle: > 1 is faster; time ratio: "
        f"eagle's seconds / the arm's per round, median and range). Machine: {m.get('cpu_model')}, torch threads "
        f"{m.get('torch_threads')}. Written by eval/bench_composed.py from composed.json.",
        "",
        "| pass | arm | rollout s | tokens | tokens/s | vs eagle | time ratio: median (range) | accepted / SD verify | "
        "SD token share | suffix share of SD verifies | accepted / verify: suffix, learned |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summarize(report):
        parts = "-"
        share = "-"
        if r["arm"] == "composed":
            share = f"{r['suffix_share']:.1%}"
            parts = f"{r['suffix_accepted']:.2f}, {r['learned_accepted']:.2f}"
        lines.append(
            f"| {r['pass']} | {r['arm']} | {r['seconds']:.1f} | {r['tokens']} | {r['tokens_per_second']:.0f} | "
            f"{r['vs_eagle']:.2f}x | {_spread(r['time_ratios'])} | {r['accepted_per_verify']:.2f} | "
            f"{r['sd_share']:.0%} | {share} | {parts} |"
        )
    return "\n".join(lines) + "\n"


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f}x)"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "composed.md")


if __name__ == "__main__":
    sys.exit(main())

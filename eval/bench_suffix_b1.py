"""The suffix drafter's chains against its trees at batch 1 (the long tail's last row), on prompts seen before.

`eval.bench_suffix` counts tokens per verify; this measures what they buy through the engine where SD pays most,
one row decoding alone: each prompt's first pass (`--samples` samples, seed 1) is the history, then every arm
decodes each prompt alone at T = 1 with SD at its strategy on every step (or plainly), a fresh drafter per arm
restored from that history. Arms take turns in rotated order over `--rounds` rounds; within a round every arm
decodes the same prompts with the same seeds (lossless SD keeps the distribution, not the draws, so the arms'
responses differ). Reported per arm: tokens/s over all rounds, the median (min-max) over rounds of its tokens/s
over plain decoding's, tokens per SD step (accepted + 1) and drafted nodes per SD step.

  OMP_NUM_THREADS=1 python -m eval.bench_suffix_b1 --target runs/tiny/model --out eval/results/suffix_b1_tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from tlt.backends.native import NativeEngine
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.bench.passes import decode_each, first_pass_history, measure, rotated
from tlt.eval.heldout import heldout_prompt_ids
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners.base import FixedTuner
from tlt.speculative.strategy import SpecStrategy

# name -> (strategy, spec_factor, min_token_prob): chains as the RL configs run them, and trees that draft more of
# what the history saw (the widest, 256 nodes, reaches 2.5 tokens per verify a pass later on the tiny policy)
ARMS = {
    "chain_5": ("5_1_6", 1.0, 0.1),
    "chain_15": ("15_1_16", 2.0, 0.1),
    "tree_7_4_32": ("7_4_32", 4.0, 0.05),
    "tree_15_4_64": ("15_4_64", 8.0, 0.02),
    "tree_31_8_256": ("31_8_256", 16.0, 0.0),
}
DEFAULT_ARMS = "chain_5,chain_15,tree_7_4_32,tree_15_4_64"


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--prompts", type=int, default=12, help="held-out prompts")
    parser.add_argument("--samples", type=int, default=8, help="first-pass samples per prompt (the history)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"SD arms besides plain, of: {', '.join(ARMS)}")
    parser.add_argument("--device", default="cpu", help="the engine's device (cpu, cuda)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    return args


def _engine(arm: str, model, eos: int, max_seq_len: int, history: list[dict], device: str) -> NativeEngine:
    if arm == "plain":
        return NativeEngine(model, eos, max_seq_len, device=device)
    strategy, factor, min_prob = ARMS[arm]
    drafter = SuffixDrafter(spec_factor=factor, min_token_prob=min_prob)
    drafter.restore(history)
    tuner = FixedTuner(strategy, threshold=1 << 30)
    return NativeEngine(model, eos, max_seq_len, tuner=tuner, drafter=drafter, device=device)


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target)
    prompts = heldout_prompt_ids(tokenizer, args.prompts)
    names = ["plain", *args.arms.split(",")]
    # room for the widest tree on top of the longest response (the engine decodes plainly where a tree would not fit)
    widest = max(SpecStrategy.parse(ARMS[name][0]).verify_tokens for name in names[1:])
    eos, max_seq_len = tokenizer.eos_token_id, max(map(len, prompts)) + args.max_new_tokens + widest
    plain = NativeEngine(model, eos, max_seq_len, device=args.device)
    history = first_pass_history(plain, prompts, args.samples, args.max_new_tokens)
    rounds = []
    for round_ in range(args.rounds):
        results = {}
        for arm in rotated(names, round_):
            engine = _engine(arm, model, eos, max_seq_len, history, args.device)
            results[arm] = decode_each(engine, prompts, args.max_new_tokens, seed=1000 * (round_ + 1))
            r = results[arm]
            print(f"[bench_suffix_b1] round {round_ + 1}/{args.rounds} {arm}: {r['tokens']} tokens in "
                  f"{r['seconds']:.1f} s", file=sys.stderr)  # fmt: skip
        rounds.append(results)
    arms = {name: ARMS[name] for name in names[1:]}
    return {"machine": describe_machine(), "settings": vars(args), "arms": arms, "rounds": rounds}


def _arm_names(report: dict) -> list[str]:
    """The SD arms in the order they were given (the JSON stores `arms` with sorted keys)."""
    given = report.get("settings", {}).get("arms")
    return given.split(",") if given else list(report["arms"])


def summarize(report: dict) -> list[dict]:
    rounds = report["rounds"]
    plain = [r["plain"]["tokens"] / r["plain"]["seconds"] for r in rounds]
    rows = []
    for arm in ["plain", *_arm_names(report)]:
        runs = [r[arm] for r in rounds]
        rates = [x["tokens"] / x["seconds"] for x in runs]
        ratios = [rate / base for rate, base in zip(rates, plain, strict=True)]
        sd_steps = sum(x["sd_steps"] for x in runs)
        rows.append(
            {
                "arm": arm,
                "strategy": "-" if arm == "plain" else report["arms"][arm][0],
                "tokens_per_second": sum(x["tokens"] for x in runs) / sum(x["seconds"] for x in runs),
                "ratio_median": statistics.median(ratios),
                "ratio_range": (min(ratios), max(ratios)),
                "tokens_per_sd_step": sum(x["sd_tokens"] for x in runs) / max(sd_steps, 1),
                "drafted_per_sd_step": sum(x["drafted"] for x in runs) / max(sd_steps, 1),
            }
        )
    return rows


def table(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    arms = "; ".join(
        f"`{name}`: {a[0]}, spec factor {a[1]:g}, min token prob {a[2]:g}"
        for name, a in ((name, report["arms"][name]) for name in _arm_names(report))
    )
    target = "/".join(Path(s["target"]).parts[-2:])
    device = s.get("device", "cpu")
    machine = m.get("cpu_model") if device == "cpu" else f"{m.get('gpu')} ({device}), host {m.get('cpu_model')}"
    lines = [
        f"# The suffix drafter at batch 1 on prompts seen before: chains against trees ({target})",
        "",
        f"{s['prompts']} held-out prompts, history: {s['samples']} first-pass samples each (seed 1); then each prompt "
        f"decoded alone, T = 1, up to {s['max_new_tokens']} tokens, SD on every step. Arms ({arms}) in rotated order "
        f"over {s['rounds']} rounds, the same seeds for every arm within a round. Machine: {machine}, torch "
        f"threads {m.get('torch_threads')}. Written by eval/bench_suffix_b1.py from suffix_b1.json.",
        "",
        "| arm | strategy | tokens/s | vs plain, per round: median (min-max) | tokens per SD step | "
        "drafted per SD step |",
        "|---|---|---|---|---|---|",
    ]
    for r in summarize(report):
        low, high = r["ratio_range"]
        lines.append(
            f"| {r['arm']} | {r['strategy']} | {r['tokens_per_second']:.0f} | {r['ratio_median']:.2f}x "
            f"({low:.2f}-{high:.2f}x) | {r['tokens_per_sd_step']:.2f} | {r['drafted_per_sd_step']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "suffix_b1.md")


if __name__ == "__main__":
    sys.exit(main())

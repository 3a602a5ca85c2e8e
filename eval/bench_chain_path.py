"""What verifying a chain as a chain saves, through the engine: the SD step's bookkeeping against the target's forward.

A draft chain (one child per node: the suffix drafter's and EAGLE's sampled drafts) is a tree, and the native
engine verified it as one: an ancestor mask built by pointer jumping, positions from the mask, gathers of the
logits and hidden states along the accepted path, and a K/V commit that moves the path's nodes to contiguous
slots. For a chain all of that is the identity (causal attention, positions in order, the accepted path a prefix
already in place), and on a CPU at one row each of those small ops costs about what it costs on a large batch.
`ModelRunner.speculate` now takes the shortcut for chains; this measures it against the tree path on the same
chains (`ModelRunner.chain_shortcut` off), with plain decoding beside them. Arms take turns in rotated order over
`--rounds` rounds (each engine first decodes a spare prompt untimed); each call decodes one held-out prompt with
`b` samples (b in `--batches`) at T = 1 with the same seeds in every arm, SD at `--strategy` on every step. The
two SD arms compute the same logits, so they emit the same tokens (checked per round: a paired comparison).
Reported per batch and arm: tokens/s, the median (min-max) over rounds of its tokens/s over plain decoding's, ms per
plain step and per SD step, an SD step in plain steps, tokens per verify (accepted + 1, per row).

  OMP_NUM_THREADS=1 python -m eval.bench_chain_path --target runs/tiny/model --out eval/results/chain_path_tiny
  OMP_NUM_THREADS=1 python -m eval.bench_chain_path --target tlt/assets/deep_v2/policy \\
      --drafter tlt/assets/deep_v2/drafter --out eval/results/chain_path_deep_v2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from tlt.backends.native import NativeEngine
from tlt.eval.bench.passes import add_sd_batch_args, batch_rounds, bench_drafter, bench_history, measure
from tlt.eval.heldout import heldout_prompt_ids
from tlt.machine import describe_machine, machine_name
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners.base import FixedTuner
from tlt.speculative.strategy import SpecStrategy

ARMS = ("plain", "sd_tree_path", "sd_chain_path")


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sd_batch_args(parser, rounds=6)  # a multiple of 3: every arm in every position
    args = parser.parse_args(argv)
    if SpecStrategy.parse(args.strategy).topk != 1:
        parser.error(f"--strategy {args.strategy}: the shortcut is for chains; give topk 1 (steps_1_verify)")
    return args


def _engine(arm: str, model, eos: int, max_seq_len: int, args, history) -> NativeEngine:
    if arm == "plain":
        return NativeEngine(model, eos, max_seq_len)
    drafter = bench_drafter(args.drafter, history)
    tuner = FixedTuner(args.strategy, threshold=1 << 30)
    engine = NativeEngine(model, eos, max_seq_len, tuner=tuner, drafter=drafter)
    engine.runner.chain_shortcut = arm == "sd_chain_path"
    return engine


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target)
    *prompts, spare = heldout_prompt_ids(tokenizer, args.prompts + 1)
    room = SpecStrategy.parse(args.strategy).verify_tokens
    eos, max_seq_len = tokenizer.eos_token_id, max(map(len, [*prompts, spare])) + args.max_new_tokens + room
    history = bench_history(args.drafter, NativeEngine(model, eos, max_seq_len), prompts, args.max_new_tokens)

    def make_engine(arm: str) -> NativeEngine:
        return _engine(arm, model, eos, max_seq_len, args, history)

    label = "bench_chain_path"
    rounds = batch_rounds(ARMS, args.batches, args.rounds, make_engine, prompts, args.max_new_tokens, label, spare)
    return {"machine": describe_machine(), "settings": vars(args), "rounds": rounds}


def _ms_per_step(run: dict, kind: str) -> float:
    return 1e3 * run[f"{kind}_seconds"] / max(run[f"{kind}_steps"], 1)


def summarize(report: dict, rows: int) -> list[dict]:
    cells = [r[str(rows)] for r in report["rounds"]]
    plain_rate = [c["plain"]["tokens"] / c["plain"]["seconds"] for c in cells]
    plain_step = [_ms_per_step(c["plain"], "plain") for c in cells]
    out = []
    for arm in ARMS:
        runs = [c[arm] for c in cells]
        ratios = [r["tokens"] / r["seconds"] / base for r, base in zip(runs, plain_rate, strict=True)]
        sd = arm != "plain"
        sd_step = [_ms_per_step(r, "sd") for r in runs] if sd else []
        in_plain = [s / p for s, p in zip(sd_step, plain_step, strict=True)] if sd else []
        out.append(
            {
                "arm": arm,
                "tokens_per_second": sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs),
                "ratio": (statistics.median(ratios), min(ratios), max(ratios)),
                "ms_plain_step": statistics.median(plain_step) if not sd else None,
                "ms_sd_step": statistics.median(sd_step) if sd else None,
                "sd_step_in_plain": statistics.median(in_plain) if sd else None,
                "tokens_per_verify": sum(r["sd_tokens"] for r in runs) / max(sum(r["sd_verifies"] for r in runs), 1),
            }
        )
    return out


def paired_ratio(report: dict, rows: int) -> tuple[float, float, float]:
    """The chain path's tokens/s over the tree path's per round (the same tokens: a paired comparison): median,
    min, max."""
    cells = [c[str(rows)] for c in report["rounds"]]
    ratios = [c["sd_tree_path"]["seconds"] / c["sd_chain_path"]["seconds"] for c in cells]
    return statistics.median(ratios), min(ratios), max(ratios)


def same_tokens(report: dict, rows: int) -> bool:
    """Whether the two SD arms emitted as many tokens and accepted as many drafts in every round."""
    keys = ("tokens", "accepted", "sd_steps")
    return all(
        all(c[str(rows)]["sd_tree_path"][k] == c[str(rows)]["sd_chain_path"][k] for k in keys) for c in report["rounds"]
    )


def table(report: dict) -> str:
    s = report["settings"]
    target = "/".join(Path(s["target"]).parts[-2:])
    drafter = "suffix (history: 8 first-pass samples per prompt)" if s["drafter"] == "suffix" else s["drafter"]
    lines = [
        f"# A chain verified as a chain against as a tree ({target})",
        "",
        f"{s['prompts']} held-out prompts, each decoded in its own call with b samples at T = 1, up to "
        f"{s['max_new_tokens']} tokens; drafter {drafter}, SD at {s['strategy']} on every step; arms in rotated "
        f"order over {s['rounds']} rounds, the same seeds in every arm. Machine: {machine_name(report['machine'])}, "
        f"torch threads {report['machine'].get('torch_threads')}. Written by eval/bench_chain_path.py from "
        "chain_path.json.",
    ]
    for rows in s["batches"]:
        lines += [
            "",
            f"## b = {rows}",
            "",
            "| arm | tokens/s | vs plain, per round: median (min-max) | ms per step | SD step in plain steps | "
            "tokens per verify |",
            "|---|---|---|---|---|---|",
        ]
        for r in summarize(report, rows):
            median, low, high = r["ratio"]
            step = r["ms_plain_step"] if r["arm"] == "plain" else r["ms_sd_step"]
            in_plain = "-" if r["sd_step_in_plain"] is None else f"{r['sd_step_in_plain']:.3f}"
            verify = "-" if r["arm"] == "plain" else f"{r['tokens_per_verify']:.2f}"
            lines.append(
                f"| {r['arm']} | {r['tokens_per_second']:.0f} | {median:.3f}x ({low:.3f}-{high:.3f}x) | {step:.3f} | "
                f"{in_plain} | {verify} |"
            )
        median, low, high = paired_ratio(report, rows)
        same = "yes" if same_tokens(report, rows) else "NO"
        lines += [
            "",
            f"The two SD arms emitted as many tokens and accepted as many drafts in every round: {same}. Chain path "
            f"over tree path, per round (paired): **{median:.3f}x** ({low:.3f}-{high:.3f}x).",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "chain_path.md")


if __name__ == "__main__":
    sys.exit(main())

"""What carrying SD costs a rollout that barely uses it: plain decoding vs the engine with a drafter and a tuner.

Two engines over the same target decode the same prompts with the same sampling seed, round by round:
  plain   no drafter (what an RL run with TLT off decodes)
  carry   the EAGLE drafter (by default untrained, as an online drafter starts) and the cost tuner, which
          keeps SD off once it has measured that the drafter does not pay

While the carry engine decodes plainly its tokens are the plain engine's, so the per-round wall ratio is the
price of carrying SD: the tuner's select / update per step, buffering the target's features for the drafter,
re-indexing that buffer as rows finish, and the drafter's catch-up over the rows still running. A round in
which the tuner explores SD draws other samples; the median of the per-round ratios is robust to those.

Writes carry.json (the rounds) and carry.md.

  python -m eval.bench_carry --target runs/quickstart/model --rounds 20 --out runs/bench-carry
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine


def run_round(engine: NativeEngine, prompts, params: SamplingParams, n: int) -> dict:
    start = time.perf_counter()
    rollouts = engine.generate(prompts, params, n=n)
    return {
        "wall": time.perf_counter() - start,
        "tokens": sum(len(r.token_ids) for r in rollouts),
        "sd_steps": sum(s.sd_on for s in engine.step_stats),
        "steps": len(engine.step_stats),
    }


def markdown(report: dict) -> str:
    machine, rounds = ", ".join(f"{k}: {v}" for k, v in report["machine"].items()), report["rounds"]
    ratios = [r["carry"]["wall"] / r["plain"]["wall"] for r in rounds]
    same = [x for x, r in zip(ratios, rounds, strict=True) if r["carry"]["sd_steps"] == 0]
    lines = [
        "# Carrying SD while it is off: plain engine vs drafter + cost tuner",
        "",
        f"Command: `python -m eval.bench_carry {' '.join(sys.argv[1:])}`",
        "",
        machine,
        "",
        f"- median carry / plain wall over {len(ratios)} rounds: **{statistics.median(ratios):.3f}**",
        f"- over the {len(same)} rounds without an SD step (identical tokens): "
        + (f"{statistics.median(same):.3f}" if same else "n/a"),
        f"- SD steps in all carry rounds: {sum(r['carry']['sd_steps'] for r in rounds)} of "
        f"{sum(r['carry']['steps'] for r in rounds)} decode steps",
        "",
        "| round | plain s | carry s | ratio | tokens plain / carry | SD steps |",
        "|---|---|---|---|---|---|",
    ]
    for i, (r, x) in enumerate(zip(rounds, ratios, strict=True), 1):
        p, c = r["plain"], r["carry"]
        lines.append(
            f"| {i} | {p['wall']:.3f} | {c['wall']:.3f} | {x:.3f} | {p['tokens']} / {c['tokens']} | {c['sd_steps']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import task_mix, training_problems
    from tlt.drafters import load_drafter
    from tlt.drafters.eagle import EagleDrafter
    from tlt.files import write_report
    from tlt.machine import describe_machine
    from tlt.models.io import load_hf_folder
    from tlt.schedulers.tuners import build_tuner

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="HF folder of the policy")
    p.add_argument("--drafter", help="saved tlt drafter folder (default: an untrained EAGLE head)")
    p.add_argument("--strategies", default="2_1_3,3_1_4,4_1_5,3_2_6", help="the cost tuner's SD arms")
    p.add_argument("--prompts", type=int, default=4, help="prompts per round (a rank's share of an RL step)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=768)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=20, help="timed rounds, after one warm-up round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    model, tokenizer = load_hf_folder(args.target)
    problems = training_problems(task_mix(load_config(None, []).data), 16 * args.prompts, seed=args.seed + 7)
    prompts = [tokenizer.encode(format_prompt(q.question)) for q in problems]
    max_seq_len = max(map(len, prompts)) + args.max_new_tokens
    drafter = load_drafter(args.drafter) if args.drafter else EagleDrafter.from_target(model, seed=args.seed)
    tuner = build_tuner("cost", args.strategies.split(","), seed=args.seed)
    engines = {
        "plain": NativeEngine(model, tokenizer.eos_token_id, max_seq_len),
        "carry": NativeEngine(model, tokenizer.eos_token_id, max_seq_len, tuner=tuner, drafter=drafter),
    }
    rounds = []
    for r in range(args.rounds + 1):  # round 0 warms up (the tuner keeps what it learns, as across RL steps)
        chunk = prompts[(r % 16) * args.prompts : (r % 16 + 1) * args.prompts]
        params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed + r)
        measured = {name: run_round(engine, chunk, params, args.samples) for name, engine in engines.items()}
        print(
            f"[bench-carry] round {r}/{args.rounds}: plain {measured['plain']['wall']:.3f} s, carry "
            f"{measured['carry']['wall']:.3f} s, {measured['carry']['sd_steps']} SD steps"
            + (" (warm-up)" if r == 0 else ""),
            file=sys.stderr,
            flush=True,
        )
        if r > 0:
            rounds.append(measured)
    report = {"settings": vars(args), "machine": describe_machine(), "rounds": rounds}
    print(write_report(Path(args.out) / "carry.md", report, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tokens per verify of several drafters against one policy, on the same held-out prompts and seeds.

Each drafter drafts on every decode step with each fixed chain `--strategies`, at each `--temperatures`, on
the first `--prompts` held-out problems of the config's data mix, `--samples` rows per prompt (as GRPO samples
a group), rows stopping at EOS as in the rollout; tokens per verify = accepted drafts + 1 per SD step and row.
Acceptance is a count, not a timing: the drafters run one after another, each on the same rows and seeds.

  OMP_NUM_THREADS=1 python -m eval.drafter_acceptance --policy tlt/assets/deep_v2/policy \\
      --drafter v1=DIR_OF_THE_OLD_DRAFTER --drafter v2=tlt/assets/deep_v2/drafter --out eval/results/DIR

writes acceptance.md and acceptance.json (raw) to --out; `--from-json FILE` renders the table again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from tlt.files import write_report  # noqa: E402
from tlt.machine import describe_machine  # noqa: E402


def measure(args: argparse.Namespace) -> dict:
    """{"settings", "machine", "cells": [{drafter, strategy, temperature, tokens_per_verify, sd_rows}]}."""
    from tlt.backends.base import SamplingParams
    from tlt.backends.native import NativeEngine
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.drafters import load_drafter
    from tlt.models.io import load_hf_folder
    from tlt.schedulers.tuners.base import FixedTuner
    from tlt.training.rl_loop import decode_sums

    cfg = load_config(args.config or None, [])
    model, tokenizer = load_hf_folder(args.policy)
    problems = heldout_problems(task_mix(cfg.data), args.prompts, cfg.data.seed)
    prompts = [tokenizer.encode(format_prompt(p.question)) for p in problems]
    max_seq_len = max(map(len, prompts)) + args.max_new_tokens
    cells = []
    for strategy in args.strategies.split(","):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for name, path in args.drafter:
                tuner = FixedTuner(strategy, threshold=len(prompts) * args.samples)
                engine = NativeEngine(
                    model, tokenizer.eos_token_id, max_seq_len, tuner=tuner, drafter=load_drafter(path)
                )
                sampling = SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
                engine.generate(prompts, sampling, n=args.samples)
                accepted_plus_rows, rows, _, _ = decode_sums(engine.step_stats)
                cell = {"drafter": name, "strategy": strategy, "temperature": temperature, "sd_rows": int(rows)}
                cells.append(cell | {"tokens_per_verify": accepted_plus_rows / rows if rows else 0.0})
                print(f"[drafter_acceptance] {name} {strategy} T={temperature}: {cells[-1]['tokens_per_verify']:.3f}")
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "from_json")}
    return {"settings": settings, "machine": describe_machine(), "cells": cells}


def report(raw: dict) -> str:
    s, cells = raw["settings"], raw["cells"]
    names = list(dict.fromkeys(c["drafter"] for c in cells))
    lines = [
        f"# Drafter acceptance against `{s['policy']}`",
        "",
        f"Tokens per verify (accepted drafts + 1 per SD step and row), SD on every step with each fixed chain; "
        f"{s['prompts']} held-out prompts x {s['samples']} samples, up to {s['max_new_tokens']} new tokens, rows "
        f"stop at EOS, sampling seed {s['seed']}. Drafters: "
        + ", ".join(f"{name} = `{path}`" for name, path in s["drafter"])
        + ".",
        "",
        "| strategy | T | " + " | ".join(names) + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |",
        "|---|---|" + "---:|" * (2 * len(names) - 1),
    ]
    keys = list(dict.fromkeys((c["strategy"], c["temperature"]) for c in cells))
    for strategy, temperature in keys:
        row = {
            c["drafter"]: c["tokens_per_verify"]
            for c in cells
            if (c["strategy"], c["temperature"]) == (strategy, temperature)
        }
        first = row[names[0]]
        ratios = [f"{row[n] / first:.3f}" if first else "n/a" for n in names[1:]]
        lines.append(
            f"| {strategy} | {temperature:g} | "
            + " | ".join(f"{row[n]:.3f}" for n in names)
            + " | "
            + " | ".join(ratios)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _named(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--drafter takes NAME=PATH, got {text!r}")
    return name, path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", help="the target's HF folder")
    p.add_argument("--drafter", type=_named, action="append", default=[], help="NAME=PATH of a drafter (repeat)")
    p.add_argument("--config", default="configs/quickstart.yaml", help="its data section picks the prompts")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--strategies", default="3_1_4,5_1_6,7_1_8")
    p.add_argument("--temperatures", default="1.0")
    p.add_argument("--max-new-tokens", type=int, default=768)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--out", help="folder for acceptance.md and acceptance.json")
    p.add_argument("--from-json", help="render from an earlier acceptance.json")
    args = p.parse_args(argv)
    if args.from_json:
        raw = json.loads(Path(args.from_json).read_text())
    else:
        if not args.policy or len(args.drafter) < 1:
            p.error("give --policy and at least one --drafter NAME=PATH (or --from-json)")
        torch.set_num_threads(1)
        raw = measure(args)
    out = Path(args.out) / "acceptance.md" if args.out else None
    print(write_report(out, raw, report) if out else report(raw), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

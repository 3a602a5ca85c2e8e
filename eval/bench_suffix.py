"""Benchmark the suffix drafter's acceptance on GRPO-style rollouts, first pass and prompts seen before.

Rollouts come from the policy itself (plain decoding, T = 1, n samples per prompt). Speculative decoding is then
replayed on them: rows advance in lockstep as they would in the engine (each step a row drafts a chain or a tree
from its context, accepts the drafted tokens along the path of its realized continuation, never the filler after
its draft, and commits those plus one), so the
drafter sees its siblings exactly as far as they have got. With deterministic drafts and the target-only rule,
a draft token is accepted exactly when the target's sample equals it, so the realized samples give the exact
acceptance distribution (no target forward needed). Pass 1: the prompts are new to the drafter; pass 2: the same
prompts with another seed, the drafter keeping what it saw in pass 1 (an RL epoch later). Reported per drafter
(suffix, and prompt lookup `ngram` on the same rows): tokens per verify (accepted + 1) over all verify steps and
over the longest row of each group, the drafted tokens per verify (what the engine's target computes beyond
the root), and the draft cost per step at batch 1 (propose + append) against the target's plain step at batch 1.
Writes suffix.json and suffix.md to --out.

  python -m eval.bench_suffix --target tlt/assets/deep_v2/policy --prompts 32 --samples 8 \
      --out eval/results/suffix_deep_v1
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
from tlt.drafters.ngram import NgramDrafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.heldout import heldout_prompt_ids
from tlt.files import write_report
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.speculative.strategy import SpecStrategy


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--strategy", default="6_1_7", help="drafted every step: a chain (6_1_7) or a tree (6_2_12)")
    parser.add_argument("--seeds", default="1,2", help="the two passes' sampling seeds")
    parser.add_argument("--spec-factor", type=float, default=1.0, help="SuffixDrafter spec_factor")
    parser.add_argument("--min-token-prob", type=float, default=0.1, help="SuffixDrafter min_token_prob")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def replay(drafter, prompts: list[list[int]], responses: list[list[int]], n: int, strategy: SpecStrategy):
    """Lockstep SD replay of `responses` (row i: prompt i // n); returns per-row lists of (accepted + 1) per
    verify, and the draft seconds per step at each running batch size."""
    rows = [prompts[i // n] for i in range(len(responses))]
    width = max(map(len, rows))
    drafter.start(torch.tensor([p + [0] * (width - len(p)) for p in rows]), None, torch.tensor([len(p) for p in rows]))
    first = [[r[0]] for r in responses]  # the prefill's token
    drafter.append(torch.tensor(first), None, torch.ones(len(responses), dtype=torch.long))
    done = [1] * len(responses)  # response tokens committed per row
    alive = [i for i, r in enumerate(responses) if len(r) > 1]
    drafter.keep(torch.tensor(alive, dtype=torch.long))
    per_row: list[list[int]] = [[] for _ in responses]
    drafted_per_row: list[list[int]] = [[] for _ in responses]
    cost: dict[int, list[float]] = {}
    while alive:
        start = time.perf_counter()
        tree = drafter.propose(strategy)
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        seconds = time.perf_counter() - start
        commits, counts = [], []
        for j, row in enumerate(alive):
            rest = responses[row][done[row] :]
            real = len(tokens[j]) if tree.real is None else tree.real[j]  # filler is never accepted
            k = accepted_length(tokens[j][:real], parents[j][:real], rest[:-1])
            per_row[row].append(k + 1)
            drafted_per_row[row].append(real - 1)
            commits.append(rest[: k + 1] + [0] * (strategy.steps - k))
            counts.append(k + 1)
            done[row] += k + 1
        start = time.perf_counter()
        drafter.append(torch.tensor(commits), None, torch.tensor(counts))
        cost.setdefault(len(alive), []).append(seconds + time.perf_counter() - start)
        keep = [j for j, row in enumerate(alive) if done[row] < len(responses[row])]
        if len(keep) < len(alive):
            drafter.keep(torch.tensor(keep, dtype=torch.long))
            alive = [alive[j] for j in keep]
    return per_row, drafted_per_row, cost


def accepted_length(tokens: list[int], parents: list[int], realized: list[int]) -> int:
    """Draft tokens the target-only rule accepts when the target's samples are `realized`: walk down from the
    root, each level to the first child whose token is the next realized one."""
    node, k = 0, 0
    while k < len(realized):
        child = next((c for c in range(1, len(tokens)) if parents[c] == node and tokens[c] == realized[k]), None)
        if child is None:
            return k
        node, k = child, k + 1
    return k


def summary(per_row: list[list[int]], drafted: list[list[int]], responses: list[list[int]], n: int) -> dict:
    flat = [x for row in per_row for x in row]
    drafts = [x for row in drafted for x in row]
    longest = [max(range(g, g + n), key=lambda i: len(responses[i])) for g in range(0, len(responses), n)]
    tail = [x for i in longest for x in per_row[i]]
    return {
        "tokens_per_verify": statistics.fmean(flat) if flat else 0.0,
        "longest_row_tokens_per_verify": statistics.fmean(tail) if tail else 0.0,
        "drafted_per_verify": statistics.fmean(drafts) if drafts else 0.0,
        "verifies": len(flat),
    }


def plain_step_seconds(model, prompt: list[int]) -> float:
    """Median seconds of a plain decode step at batch 1 (64 tokens after a warm-up)."""
    engine = NativeEngine(model, None, len(prompt) + 80)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, seed=0)
    engine.generate([prompt], sampling)
    engine.generate([prompt], sampling)
    return statistics.median(s.seconds for s in engine.step_stats)


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target)
    prompts = heldout_prompt_ids(tokenizer, args.prompts)
    engine = NativeEngine(model, tokenizer.eos_token_id, max(map(len, prompts)) + args.max_new_tokens)
    strategy = SpecStrategy.parse(args.strategy)
    suffix = SuffixDrafter(spec_factor=args.spec_factor, min_token_prob=args.min_token_prob)
    drafters = {"suffix": suffix, "ngram": NgramDrafter()}
    passes = []
    for number, seed in enumerate(int(s) for s in args.seeds.split(",")):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=seed)
        start = time.perf_counter()
        responses = [r.token_ids.tolist() for r in engine.generate(prompts, sampling, n=args.samples)]
        print(f"[bench_suffix] pass {number + 1}: {len(responses)} rollouts in {time.perf_counter() - start:.0f} s",
              file=sys.stderr)  # fmt: skip
        result = {"seed": seed, "tokens": sum(map(len, responses))}
        for name, drafter in drafters.items():
            per_row, drafted, cost = replay(drafter, prompts, responses, args.samples, strategy)
            result[name] = summary(per_row, drafted, responses, args.samples) | {
                "draft_seconds_b1": statistics.median(cost[1]) if 1 in cost else None
            }
        passes.append(result)
    return {
        "machine": describe_machine(),
        "settings": vars(args),
        "plain_step_seconds_b1": plain_step_seconds(model, prompts[0]),
        "passes": passes,
    }


def table(results: dict) -> str:
    s, step = results["settings"], results["plain_step_seconds_b1"]
    lines = [
        f"# Suffix drafter: tokens per verify on GRPO rollouts ({Path(s['target']).name})",
        "",
        f"{s['prompts']} held-out prompts x {s['samples']} samples, T = 1, up to {s['max_new_tokens']} tokens, chain "
        f"{s['strategy']} every step, SD replayed on the realized samples (exact for deterministic drafts). Pass 2: "
        f"the same prompts, another seed, the drafter keeping pass 1. Machine: {results['machine'].get('cpu_model')}; "
        f"target plain step at batch 1: {step * 1000:.2f} ms. Written by eval/bench_suffix.py from suffix.json.",
        "",
        "| pass | drafter | tokens per verify | longest row of each group | drafted tokens per verify | draft cost per "
        "step, batch 1 |",
        "|---|---|---|---|---|---|",
    ]
    for number, p in enumerate(results["passes"], 1):
        for name in ("suffix", "ngram"):
            r = p[name]
            cost = r["draft_seconds_b1"]
            share = "-" if cost is None else f"{cost * 1e6:.0f} us ({cost / step:.1%} of a target step)"
            lines.append(
                f"| {number} | {name} | {r['tokens_per_verify']:.2f} | {r['longest_row_tokens_per_verify']:.2f} | "
                f"{r.get('drafted_per_verify', float('nan')):.2f} | {share} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = _args(argv)
    torch.set_num_threads(1)
    print(write_report(Path(args.out) / "suffix.md", run(args), table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

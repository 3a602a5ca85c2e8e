"""Benchmark the suffix drafter's acceptance on GRPO-style rollouts, first pass and prompts seen before.

Rollouts come from the policy itself (plain decoding, T = 1, n samples per prompt). Speculative decoding is then
replayed on them: rows advance in lockstep as they would in the engine (each step a row drafts a chain or a tree
from its context, accepts the drafted tokens along the path of its realized continuation, never the filler after
its draft, and commits those plus one), so the
drafter sees its siblings exactly as far as they have got. With deterministic drafts and the target-only rule,
a draft token is accepted exactly when the target's sample equals it, so the realized samples give the exact
acceptance distribution (no target forward needed). Pass 1: the prompts are new to the drafter; each later pass
(one per --seeds entry): the same prompts with another seed, the drafter keeping what it saw before (an RL epoch
later). Reported per drafter (suffix, and prompt lookup `ngram` on the same rows): tokens per verify (accepted + 1)
over all verify steps and over the longest row of each group, the drafted tokens per verify (what the engine's
target computes beyond the root), and the draft cost per step at batch 1 (propose + append) against the target's
plain step at batch 1. Then the bound (`hindsight`): what a drafter copying from the same text would accept if it
knew each sample before drafting, so the gap between a drafter and the bound is what guessing costs, and a target
above the bound cannot be met by copying.
Writes suffix.json and suffix.md to --out.

  python -m eval.bench_suffix --target tlt/assets/deep_v2/policy --prompts 32 --samples 8 \
      --seeds 1,2,3 --out eval/results/suffix_deep_v2
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
from tlt.eval.bench.passes import measure
from tlt.eval.heldout import heldout_prompt_ids
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
    parser.add_argument("--seeds", default="1,2", help="one pass per seed, over the same prompts")
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


def hindsight(
    prompts: list[list[int]],
    earlier: list[list[list[int]]],
    responses: list[list[int]],
    n: int,
    steps: int,
    min_match: int,
) -> list[list[int]]:
    """An upper bound on any drafter that copies from what the suffix drafter sees: the same lockstep replay, but
    each row and step drafts, knowing its realized continuation, the best of all continuations that followed an
    occurrence of its context's last `min_match` tokens in the text seen so far (its prompt, the earlier passes'
    responses to it, and every row of its group as far as committed, its own included), `steps` tokens at most.
    A suffix-tree draft (chain or tree) is such a continuation (match >= 1), so from the same point no tree of this
    depth accepts more.
    Returns per-row lists of (accepted + 1) per verify."""
    sequences: list[list[int]] = []  # the seen text: each a growing token list
    index: dict[tuple, list[tuple[int, int]]] = {}  # (group, last min_match tokens) -> (sequence, next position)

    def add(group: int, seq: int, start: int) -> None:
        tokens = sequences[seq]
        for end in range(max(start, min_match), len(tokens)):
            index.setdefault((group, *tokens[end - min_match : end]), []).append((seq, end))

    for group, prompt in enumerate(prompts):
        for response in (r for past in earlier for r in past[group * n : (group + 1) * n]):
            sequences.append(prompt + response)
            add(group, len(sequences) - 1, 0)
    rows = []  # this pass's rows: their sequence, committed response tokens
    for i, response in enumerate(responses):
        sequences.append(prompts[i // n] + response[:1])
        add(i // n, len(sequences) - 1, 0)
        rows.append(len(sequences) - 1)
    done = [1] * len(responses)
    per_row: list[list[int]] = [[] for _ in responses]
    alive = [i for i, r in enumerate(responses) if len(r) > 1]
    while alive:
        commits = []
        for i in alive:
            rest, context = responses[i][done[i] : done[i] + steps + 1], sequences[rows[i]]
            best = 0
            for seq, at in index.get((i // n, *context[len(context) - min_match :]), ()):
                text, k = sequences[seq], 0
                while k < len(rest) - 1 and at + k < len(text) and text[at + k] == rest[k]:
                    k += 1
                best = max(best, k)
            per_row[i].append(best + 1)
            commits.append((i, rest[: best + 1]))
        for i, tokens in commits:  # lockstep: the group sees this step's tokens from the next step on
            before = len(sequences[rows[i]])
            sequences[rows[i]].extend(tokens)
            add(i // n, rows[i], before)
            done[i] += len(tokens)
        alive = [i for i in alive if done[i] < len(responses[i])]
    return per_row


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


HINDSIGHT_MATCHES = (1, 2)  # the bounds' shortest match (context tokens)


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target)
    prompts = heldout_prompt_ids(tokenizer, args.prompts)
    engine = NativeEngine(model, tokenizer.eos_token_id, max(map(len, prompts)) + args.max_new_tokens)
    strategy = SpecStrategy.parse(args.strategy)
    suffix = SuffixDrafter(spec_factor=args.spec_factor, min_token_prob=args.min_token_prob)
    drafters = {"suffix": suffix, "ngram": NgramDrafter()}
    passes, seen = [], []
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
        for match in HINDSIGHT_MATCHES:
            per_row = hindsight(prompts, seen, responses, args.samples, strategy.steps, match)
            result[f"hindsight_{match}"] = summary(per_row, [], responses, args.samples) | {"drafted_per_verify": None}
        seen.append(responses)
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
        f"{s['prompts']} held-out prompts x {s['samples']} samples, T = 1, up to {s['max_new_tokens']} tokens, "
        f"{'chain' if SpecStrategy.parse(s['strategy']).topk == 1 else 'tree'} {s['strategy']} every step (spec "
        f"factor {s.get('spec_factor', 1.0):g}), SD replayed on the realized samples (exact for deterministic "
        "drafts). Passes after the first: the same prompts, another seed, the drafter keeping the passes before. "
        f"Machine: {results['machine'].get('cpu_model')}; target plain step at batch 1: {step * 1000:.2f} ms. "
        "Written by eval/bench_suffix.py from suffix.json.",
        "",
        "| pass | drafter | tokens per verify | longest row of each group | drafted tokens per verify | draft cost per "
        "step, batch 1 |",
        "|---|---|---|---|---|---|",
    ]
    for number, p in enumerate(results["passes"], 1):
        for name in ("suffix", "ngram", *(f"hindsight_{m}" for m in HINDSIGHT_MATCHES if f"hindsight_{m}" in p)):
            r = p[name]
            cost, drafted = r.get("draft_seconds_b1"), r.get("drafted_per_verify", float("nan"))
            share = "-" if cost is None else f"{cost * 1e6:.0f} us ({cost / step:.1%} of a target step)"
            label = f"bound: hindsight, match >= {name[10:]}" if name.startswith("hindsight") else name
            lines.append(
                f"| {number} | {label} | {r['tokens_per_verify']:.2f} | {r['longest_row_tokens_per_verify']:.2f} | "
                f"{'-' if drafted is None else f'{drafted:.2f}'} | {share} |"
            )
    if "hindsight_1" in results["passes"][0]:
        lines += ["", HINDSIGHT_NOTE]
    return "\n".join(lines) + "\n"


HINDSIGHT_NOTE = (
    "Bound rows: each row and step drafts, knowing its realized sample, the best continuation of its context's last "
    "1 (2) tokens anywhere in what the suffix drafter has seen by then (the prompt, earlier passes' responses to "
    "it, the group's rows as far as committed), at the strategy's depth. Every suffix-tree draft, chain or tree, "
    "is such a continuation, so from the same point no drafter copying from that text accepts more; a drafter "
    "must guess which continuation the sample takes, and the gap to the bound is what guessing costs. Match >= 1 "
    "lets the bound pick among every occurrence of the last token, so it is loose; a suffix tree matches as long "
    "a context as it can."
)


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "suffix.md")


if __name__ == "__main__":
    sys.exit(main())

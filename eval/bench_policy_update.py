"""GRPO policy-update cost of one rollout batch under two micro-batch cuts, or two precisions, side by side.

One sampled rollout (T = 1, `--prompts` x `--samples`, long-tailed lengths) of a base policy, then the trainer's
work on it: the old log-prob recompute and one update (`grpo.update_policy`), in micro-batches of at most
`grpo.micro_batch_tokens` padded tokens, cut

- `fewest`: into as few micro-batches as the token budget allows (a forward costs 10^9 tokens), which fills the
  budget after a long row with short rows padded to it, as tlt's greedy cut did;
- `default`: to minimise padded tokens + `grpo.micro_batch_overhead_tokens` per forward (64).

Every repeat starts from the same policy and a fresh optimizer, so both cuts do the same arithmetic on real
tokens; they differ in padding and in the number of forwards. With `--compare precision` the two variants are
`grpo.precision` 32-true and bf16-mixed (bf16 autocast), both with the default cut; with `--compare
checkpointing`, `grpo.activation_checkpointing` off (`stored`) and on (`checkpointed`). Reported: padded / real
tokens, forwards, the activations autograd keeps for the backward of the largest micro-batch (distinct
storages, weights excluded), and the median seconds over `--repeats` after a warm-up (which variant goes first
alternates), one torch thread.

  OMP_NUM_THREADS=1 python -m eval.bench_policy_update --model runs/small/model --out runs/bench-update
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.config import DataConfig, GRPOConfig
from tlt.data.prompts import format_prompt
from tlt.data.rewards import math_rewards
from tlt.data.splits import task_mix, training_problems
from tlt.files import write_report
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.training.grpo import (
    GRPOBatch,
    GRPOModule,
    group_advantages,
    make_batch,
    micro_batches,
    recompute_old_logprobs,
    update_policy,
)

CUTS = {"fewest": 10**9, "default": GRPOConfig.micro_batch_overhead_tokens}
PRECISIONS = ("32-true", "bf16-mixed")
TITLES = {"cuts": "micro-batch cuts", "precision": "precisions", "checkpointing": "activation checkpointing off / on"}


def variants(compare: str, minibatch_size: int) -> dict[str, GRPOConfig]:
    """The two GRPO settings compared: micro-batch cuts (`cuts`) or training precisions (`precision`)."""
    if compare == "cuts":
        return {
            name: GRPOConfig(minibatch_size=minibatch_size, micro_batch_overhead_tokens=cost)
            for name, cost in CUTS.items()
        }
    if compare == "checkpointing":
        return {
            name: GRPOConfig(minibatch_size=minibatch_size, activation_checkpointing=name == "checkpointed")
            for name in ("stored", "checkpointed")
        }
    return {name: GRPOConfig(minibatch_size=minibatch_size, precision=name) for name in PRECISIONS}


def rollout_batch(model, tokenizer, args) -> GRPOBatch:
    """One sampled rollout of `args.prompts` training problems x `args.samples`, laid out for the update."""
    problems = training_problems(task_mix(DataConfig()), args.prompts, args.seed)
    engine = NativeEngine(copy.deepcopy(model), tokenizer.eos_token_id, max_seq_len=args.max_new_tokens + 128)
    prompts = [tokenizer.encode(format_prompt(p.question)) for p in problems]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    rollouts = engine.generate(prompts, sampling, n=args.samples)
    texts = tokenizer.batch_decode([r.token_ids.tolist() for r in rollouts], skip_special_tokens=True)
    rewards = torch.tensor(math_rewards(texts, [problems[r.prompt_index].answer for r in rollouts]))
    return make_batch(
        [r.prompt_ids for r in rollouts],
        [r.token_ids for r in rollouts],
        group_advantages(rewards, args.samples),
        tokenizer.pad_token_id,
    )


def padding(batch: GRPOBatch, cfg: GRPOConfig, generator_seed: int) -> dict:
    """Padded and real tokens and forwards of the recompute and the update's minibatches under `cfg`."""
    lengths = batch.attention_mask.sum(1)
    index_sets = [torch.arange(batch.size)]  # the recompute: every row
    index_sets += list(
        torch.randperm(batch.size, generator=torch.Generator().manual_seed(generator_seed)).split(cfg.minibatch_size)
    )
    padded = real = forwards = 0
    for rows in index_sets:
        for group in micro_batches(lengths[rows], cfg.micro_batch_tokens, cfg.micro_batch_overhead_tokens):
            padded += len(group) * int(lengths[rows][group].max())
            real += int(lengths[rows][group].sum())
            forwards += 1
    return {"padded": padded, "real": real, "forwards": forwards}


def saved_bytes(fn, exclude: set[int] = frozenset()) -> int:
    """Bytes of the distinct storages autograd keeps from `fn`'s forwards for their backward, those whose
    data pointer is in `exclude` (the weights) left out."""
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def activation_bytes(model, batch: GRPOBatch, cfg: GRPOConfig) -> int:
    """Activations kept for the backward of the update's largest micro-batch under `cfg` (weights excluded)."""
    module = GRPOModule(copy.deepcopy(model), cfg, temperature=1.0)
    full = recompute_old_logprobs(module, batch)
    lengths = full.attention_mask.sum(1)
    groups = micro_batches(lengths, cfg.micro_batch_tokens, cfg.micro_batch_overhead_tokens)
    largest = max(groups, key=lambda g: len(g) * int(lengths[g].max()))
    weights = {p.untyped_storage().data_ptr() for p in module.policy.parameters()}
    return saved_bytes(lambda: module.loss(full.rows(largest)), weights)


def timed_update(model, batch: GRPOBatch, cfg: GRPOConfig, seed: int) -> float:
    """Seconds of the recompute + one update from a copy of `model` (the trainer's work on one rollout)."""
    module = GRPOModule(copy.deepcopy(model), cfg, temperature=1.0)
    optimizer = module.configure_optimizers()
    start = time.perf_counter()
    batch = recompute_old_logprobs(module, batch)
    update_policy(module, optimizer, batch, torch.Generator().manual_seed(seed))
    return time.perf_counter() - start


def render(report: dict) -> str:
    s = report["settings"]
    lengths = report["response_lengths"]
    first = next(iter(report["variants"]))
    lines = [
        f"# GRPO update of one rollout: {TITLES[s['compare']]} side by side",
        "",
        f"`{s['model']}`, {s['prompts']} prompts x {s['samples']} samples at T = 1 (response tokens: p50 "
        f"{lengths['p50']}, max {lengths['max']}, mean {lengths['mean']:.0f}); recompute + one update, "
        f"minibatches of {s['minibatch_size']}, {s['micro_batch_tokens']} tokens per micro-batch at most; medians "
        f"of {s['repeats']} repeats.",
        "",
        f"| variant | precision | checkpointing | forward cost (tokens) | forwards | padded / real tokens | "
        f"activations kept (MiB) | seconds | vs {first} |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = report["variants"][first]["seconds"]
    for name, row in report["variants"].items():
        lines.append(
            f"| {name} | {row['precision']} | {'on' if row['activation_checkpointing'] else 'off'} | "
            f"{row['overhead_tokens']} | {row['forwards']} | {row['padded'] / row['real']:.2f} | "
            f"{row['activation_mib']:.1f} | {row['seconds']:.2f} | {base / row['seconds']:.2f}x |"
        )
    lines += ["", "Machine: " + json.dumps(report["machine"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF folder of the policy (e.g. runs/small/model)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=768)
    p.add_argument("--minibatch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", choices=("cuts", "precision", "checkpointing"), default="cuts")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        print(f"bench_policy_update: error: no HF model folder at {args.model}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    model, tokenizer = load_hf_folder(args.model)
    model.eval()
    batch = rollout_batch(model, tokenizer, args)
    response = sorted(batch.response_mask.sum(1).tolist())
    configs = variants(args.compare, args.minibatch_size)
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for cfg in configs.values():  # warm-up, not counted
        timed_update(model, batch, cfg, args.seed)
    for repeat in range(args.repeats):
        for name in list(configs)[:: 1 if repeat % 2 == 0 else -1]:  # alternate which cut goes first
            cfg = configs[name]
            seconds[name].append(timed_update(model, batch, cfg, args.seed))
            print(f"[bench] repeat {repeat + 1}/{args.repeats} {name}: {seconds[name][-1]:.2f}s", flush=True)
    report = {
        "settings": vars(args) | {"micro_batch_tokens": GRPOConfig.micro_batch_tokens},
        "machine": describe_machine(),
        "response_lengths": {
            "p50": response[len(response) // 2],
            "max": response[-1],
            "mean": statistics.fmean(response),
        },
        "variants": {
            name: {
                "overhead_tokens": cfg.micro_batch_overhead_tokens,
                "precision": cfg.precision,
                "activation_checkpointing": cfg.activation_checkpointing,
                "activation_mib": activation_bytes(model, batch, cfg) / 2**20,
                "seconds": statistics.median(seconds[name]),
                "all": seconds[name],
            }
            | padding(batch, cfg, args.seed)
            for name, cfg in configs.items()
        },
    }
    print(write_report(Path(args.out) / "update.md", report, render), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

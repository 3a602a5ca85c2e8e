"""The multi-process policy update under `train.sharding` replicate and fsdp, side by side on N CPU ranks.

Each of `--world` gloo ranks (one torch thread each) builds the same random `--preset` policy and a GRPO batch
of `--rows` rows with long-tailed lengths (prompt 20-40 tokens, response lengths log-normal with median
`--median-len`, capped at `--max-len`, as the quickstart's rollouts are), then alternately (which one goes first
alternates) runs one update (`grpo.epochs` x minibatches, AdamW) with

- `replicate`: `data_parallel.update_policy_sharded` on the rank's full policy (gradients all-reduced);
- `fsdp`: `fsdp.ShardedPolicy.update`, which also gathers the new weights into the rank's replica.

Reported per variant: the median update seconds over `--repeats` (after a warm-up of each), the slowest rank's;
and the bytes of training state one rank holds, counted from its tensors (its local shards under fsdp):
parameters, gradients and AdamW state, plus under fsdp the full replica the rank keeps for its rollout.
Both start every repeat from the same weights and a fresh optimizer.

  OMP_NUM_THREADS=1 python -m eval.bench_sharding --preset small --out runs/bench-sharding
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tlt.config import GRPOConfig
from tlt.files import write_report
from tlt.machine import describe_machine
from tlt.models.presets import build_model
from tlt.training.distributed.data_parallel import rows_by_length, update_policy_sharded
from tlt.training.distributed.fsdp import ShardedPolicy
from tlt.training.distributed.launch import launch_cpu
from tlt.training.grpo import GRPOModule, make_batch, recompute_old_logprobs

VARIANTS = ("replicate", "fsdp")
VOCAB = 1024


def synthetic_batch(rows: int, median_len: int, max_len: int, seed: int):
    """GRPO rows with the rollouts' length profile (log-normal responses, a long tail to max_len); random
    tokens and advantages: an update's cost depends on the lengths, not on the tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = (torch.randn(rows, generator=g) * 0.8).exp().mul(median_len).clamp(4, max_len).long()
    prompts = [torch.randint(3, VOCAB, (int(torch.randint(20, 40, (), generator=g)),), generator=g) for _ in lengths]
    responses = [torch.randint(3, VOCAB, (int(n),), generator=g) for n in lengths]
    return make_batch(prompts, responses, torch.randn(rows, generator=g), pad_id=0)


def state_bytes(tensors) -> int:
    """Bytes of the given tensors' local storage (a DTensor's shard on this rank)."""
    total = 0
    for t in tensors:
        t = t.to_local() if isinstance(t, DTensor) else t
        total += t.numel() * t.element_size()
    return total


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for entry in optimizer.state.values() for v in entry.values() if torch.is_tensor(v)]


def _replicate(policy, cfg, batch, seed):
    module = GRPOModule(copy.deepcopy(policy), cfg, 1.0)
    optimizer = module.configure_optimizers()
    start = time.perf_counter()
    update_policy_sharded(module, optimizer, batch, torch.Generator().manual_seed(seed))
    seconds = time.perf_counter() - start
    return seconds, _memory(module.policy, optimizer)


def _fsdp(policy, cfg, batch, seed):
    replica = copy.deepcopy(policy)
    sharded = ShardedPolicy(replica, cfg, 1.0)
    start = time.perf_counter()
    sharded.update(batch, torch.Generator().manual_seed(seed), rows_by_length(batch))
    seconds = time.perf_counter() - start
    return seconds, _memory(sharded.module.policy, sharded.optimizer, replica)


def _memory(trained: torch.nn.Module, optimizer: torch.optim.Optimizer, replica: torch.nn.Module | None = None) -> dict:
    """Bytes of one rank's training state: the trained copy's parameters and gradients, the optimizer state,
    and the rollout replica kept beside them (fsdp)."""
    params = list(trained.parameters())
    return {
        "params": state_bytes(params),
        "grads": state_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer": state_bytes(optimizer_tensors(optimizer)),
        "replica": 0 if replica is None else state_bytes(replica.parameters()),
    }


def rank_main(ctx, args) -> dict:
    torch.set_num_threads(1)
    policy = build_model(args.preset, VOCAB, seed=0)
    cfg = GRPOConfig(
        minibatch_size=args.minibatch_size, epochs=args.epochs, micro_batch_overhead_tokens=args.overhead_tokens
    )
    batch = recompute_old_logprobs(
        GRPOModule(policy, cfg, 1.0), synthetic_batch(args.rows, args.median_len, args.max_len, seed=1)
    )
    seconds = {v: [] for v in VARIANTS}
    memory = {}
    for repeat in range(args.repeats + 1):  # repeat 0: warm-up
        order = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            dist.barrier()
            if variant == "replicate":
                took, memory[variant] = _replicate(policy, cfg, batch, repeat)
            else:
                took, memory[variant] = _fsdp(policy, cfg, batch, repeat)
            slowest = torch.tensor(took)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if repeat:
                seconds[variant].append(slowest.item())
            if ctx.rank == 0:
                print(f"[bench] repeat {repeat}/{args.repeats} {variant}: {slowest.item():.2f} s", flush=True)
    tokens = int(batch.attention_mask.sum())
    params = sum(p.numel() for p in policy.parameters())
    return {"seconds": seconds, "memory": memory, "tokens": tokens, "params": params}


def render(report: dict) -> str:
    args, r0 = argparse.Namespace(**report["args"]), report["ranks"][0]
    lines = [
        f"# Policy update under train.sharding: replicate vs fsdp ({args.world} CPU ranks, `{args.preset}` preset)",
        "",
        f"Command: `OMP_NUM_THREADS=1 python -m eval.bench_sharding {' '.join(sys.argv[1:])}`",
        "",
        f"{r0['params'] / 1e6:.1f}M parameters; {args.rows} rows, {r0['tokens']} tokens (median response "
        f"{args.median_len}, cap {args.max_len}); minibatch {args.minibatch_size}, {args.epochs} epoch(s), "
        f"grpo.micro_batch_overhead_tokens={args.overhead_tokens}; "
        f"median of {args.repeats} repeats after a warm-up, the slowest rank's seconds.",
        "",
        "| sharding | update s (median) | min | max | params | grads | AdamW state | rollout replica | total |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        s = r0["seconds"][v]
        mem = r0["memory"][v]
        mb = {k: x / 2**20 for k, x in mem.items()}
        lines.append(
            f"| {v} | {statistics.median(s):.2f} | {min(s):.2f} | {max(s):.2f} | {mb['params']:.1f} MiB | "
            f"{mb['grads']:.1f} MiB | {mb['optimizer']:.1f} MiB | {mb['replica']:.1f} MiB | "
            f"{sum(mb.values()):.1f} MiB |"
        )
    ratio = statistics.median(r0["seconds"]["fsdp"]) / statistics.median(r0["seconds"]["replicate"])
    paired = statistics.median(f / r for f, r in zip(r0["seconds"]["fsdp"], r0["seconds"]["replicate"], strict=True))
    lines += [
        "",
        f"fsdp / replicate update time: {ratio:.3f} (medians), {paired:.3f} (median of paired repeats).",
        "Memory is rank 0's (rank 1's differs only in how the shards' sizes round). Under replicate a rank holds",
        "16 bytes per parameter in float32 (weights, gradients, two AdamW moments); under fsdp 16 / N bytes",
        "plus its 4-byte rollout replica.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--median-len", type=int, default=60)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--minibatch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--overhead-tokens", type=int, default=GRPOConfig.micro_batch_overhead_tokens)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("runs/bench-sharding"))
    args = p.parse_args(argv)
    ranks = launch_cpu(rank_main, args.world, args, timeout_s=None)
    report = {"args": vars(args) | {"out": str(args.out)}, "ranks": ranks, "machine": describe_machine()}
    print(write_report(args.out / "report.md", report, render))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

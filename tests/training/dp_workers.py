"""Worker functions for test_train_multiprocess.py, at module level so spawned children can import them."""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tlt.config import GRPOConfig
from tlt.models.presets import build_model
from tlt.training.distributed.data_parallel import gather_rows, shard, update_policy_sharded
from tlt.training.distributed.launch import WorkerContext
from tlt.training.grpo import GRPOModule, make_batch, update_policy

G = 4  # group size of the fixed batch
GROUPS = 3  # split 2 + 1 over two ranks: uneven shards
GRPO = GRPOConfig(lr=1e-3, minibatch_size=5, epochs=2, kl_coef=0.05, entropy_coef=0.01)


def length_reward(texts: list[str], golds: list[str]) -> list[float]:
    """Rewards that vary inside a group (math rewards of a random policy are all 0)."""
    return [len(t) / 100 for t in texts]


def train_with_slow_rank0(ctx: WorkerContext, cfg) -> dict | None:
    """One rank of a `tlt train` run (as its spawned ranks run it) where rank 0's rollout takes 0.8 s longer,
    so rank 1 is idle while rank 0 still rolls out the step."""
    from tlt.training.distributed.data_parallel import DistributedRLTrainer
    from tlt.training.train import _rank_main

    rollout = DistributedRLTrainer._rollout

    def slow_rollout(self, problems):
        if self.rank == 0:
            time.sleep(0.8)
        return rollout(self, problems)

    DistributedRLTrainer._rollout = slow_rollout  # this spawned process only
    return _rank_main(ctx, cfg, length_reward)


def _fixed_batch():
    """GROUPS * G rows of random prompts and responses of different lengths, random advantages."""
    g = torch.Generator().manual_seed(0)
    B = GROUPS * G

    def tokens(low: int, high: int) -> torch.Tensor:
        return torch.randint(3, 300, (int(torch.randint(low, high, (), generator=g)),), generator=g)

    prompts = [tokens(3, 7) for _ in range(B)]
    responses = [tokens(1, 12) for _ in range(B)]
    advantages = torch.randn(B, generator=g)
    return make_batch(prompts, responses, advantages, pad_id=0)


def _module(policy: torch.nn.Module) -> GRPOModule:
    reference = copy.deepcopy(policy)
    return GRPOModule(policy, GRPO, temperature=1.0, reference=reference)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _optimizer(module: GRPOModule, kind: str) -> torch.optim.Optimizer:
    if kind == "adamw":
        return module.configure_optimizers()
    return torch.optim.SGD(module.policy.parameters(), lr=0.1)


def update_equivalence(ctx: WorkerContext, optimizer: str) -> dict:
    """The sharded update from each rank's rows (gathered, then dealt out by length) vs (on rank 0) one
    process's update of all rows; both from the same policy, old / reference log-probs and generator seed."""
    torch.manual_seed(0)
    module = _module(build_model("test", 300, 1, 2, 0, seed=0))
    full, _ = module.recompute(_fixed_batch())  # old and reference log-probs of all rows, alike on all ranks
    start = _flat(module.policy)
    single = None
    if ctx.rank == 0:
        alone = _module(copy.deepcopy(module.policy))
        stats = update_policy(alone, _optimizer(alone, optimizer), full, torch.Generator().manual_seed(7))
        single = {"params": _flat(alone.policy), "stats": stats}
    first, count = shard(GROUPS, ctx.rank, ctx.world_size)
    rows = torch.arange(first * G, (first + count) * G)
    generator = torch.Generator().manual_seed(7)
    opt = _optimizer(module, optimizer)
    mine = full.rows(rows)  # trimmed to this share's longest row: the ranks' widths differ
    gathered = gather_rows(mine)
    stats = update_policy_sharded(module, opt, gathered, generator)
    after = _flat(module.policy)
    return {
        "start": start,
        "params": after,
        "stats": stats,
        "single": single,
        "rows": rows.tolist(),
        "width": mine.input_ids.shape[1],
        "full": full,
        "gathered": gathered,
    }


def run_equivalence(ctx: WorkerContext) -> dict:
    return {name: update_equivalence(ctx, name) for name in ("adamw", "sgd")}


def fsdp_equivalence(ctx: WorkerContext, checkpointing: bool = False) -> dict:
    """Two updates of the same rows (AdamW, KL and entropy on, micro-batches of ~2 rows so that the ranks'
    micro-batch counts differ) by the replicated data-parallel update and by `ShardedPolicy` (with activation
    checkpointing if asked); then the sharded optimizer state is saved in the replicated layout, loaded into
    a fresh `ShardedPolicy`, and a third update is taken by both."""
    from tlt.training.distributed.data_parallel import rows_by_length
    from tlt.training.distributed.fsdp import ShardedPolicy

    cfg = dataclasses.replace(GRPO, micro_batch_tokens=24, micro_batch_overhead_tokens=0)
    torch.manual_seed(0)
    policy = build_model("test", 300, 1, 2, 0, seed=0)
    replicated = GRPOModule(policy, cfg, temperature=1.0, reference=copy.deepcopy(policy))
    full, _ = replicated.recompute(_fixed_batch())
    replica = copy.deepcopy(policy)
    sharded_cfg = dataclasses.replace(cfg, activation_checkpointing=checkpointing)
    sharded = ShardedPolicy(replica, sharded_cfg, 1.0, replicated.reference)
    rows = rows_by_length(full)
    calls = {"replicated": _count_calls(replicated, "loss"), "sharded": _count_calls(sharded.module, "loss")}
    adamw = replicated.configure_optimizers()
    start = _flat(policy)
    stats = []
    for seed in range(2):
        a = update_policy_sharded(replicated, adamw, full, torch.Generator().manual_seed(seed))
        stats.append((a, sharded.update(full, torch.Generator().manual_seed(seed), rows)))
    out = {"start": start, "stats": stats, "calls": {k: v["n"] for k, v in calls.items()}}
    out["params"] = (_flat(replicated.policy), _flat(replica))
    out["states"] = (copy.deepcopy(adamw.state_dict()), sharded.optimizer_state())
    fresh = ShardedPolicy(copy.deepcopy(replica), sharded_cfg, 1.0, replicated.reference)
    fresh.load_optimizer_state(out["states"][1])
    sharded.update(full, torch.Generator().manual_seed(2), rows)
    fresh.update(full, torch.Generator().manual_seed(2), rows)
    out["after_load"] = (_flat(replica), _flat(fresh.replica))
    return out


def fsdp_state_round_trip(ctx: WorkerContext, folder: str) -> dict:
    """Two updates by `ShardedPolicy`; its full optimizer state written to a file by rank 0 and read back by
    every rank, as a checkpoint is. The third update taken straight on, by a fresh `ShardedPolicy` and by one
    process's AdamW (on every rank alike) from the file, and by one process's fresh AdamW (the state unused);
    the fourth taken straight on and by a fresh `ShardedPolicy` from the one process's state after the third.
    Returns the flat weights before the third update and after each."""
    from tlt.training.distributed.data_parallel import rows_by_length
    from tlt.training.distributed.fsdp import ShardedPolicy

    torch.manual_seed(0)
    policy = build_model("test", 300, 1, 2, 0, seed=0)
    reference = copy.deepcopy(policy)
    full, _ = GRPOModule(policy, GRPO, 1.0, reference).recompute(_fixed_batch())
    rows = rows_by_length(full)
    sharded = ShardedPolicy(policy, GRPO, 1.0, reference)
    for seed in range(2):
        sharded.update(full, torch.Generator().manual_seed(seed), rows)
    saved = _through_file(sharded.optimizer_state(), Path(folder) / "fsdp.pt", ctx.rank)
    before = copy.deepcopy(policy)

    def resumed(weights: torch.nn.Module, state: dict) -> ShardedPolicy:
        fresh = ShardedPolicy(copy.deepcopy(weights), GRPO, 1.0, reference)
        fresh.load_optimizer_state(state)
        return fresh

    def alone(state: dict | None) -> tuple[GRPOModule, torch.optim.Optimizer]:
        module = GRPOModule(copy.deepcopy(before), GRPO, 1.0, reference)
        adamw = module.configure_optimizers()
        if state is not None:
            adamw.load_state_dict(state)
        update_policy(module, adamw, full, torch.Generator().manual_seed(2))
        return module, adamw

    fresh = resumed(before, saved)
    for one in (sharded, fresh):
        one.update(full, torch.Generator().manual_seed(2), rows)
    (single, adamw), (cold, _) = alone(saved), alone(None)
    out = {"before": _flat(before), "third": [_flat(m) for m in (policy, fresh.replica, single.policy, cold.policy)]}
    back = resumed(single.policy, _through_file(adamw.state_dict(), Path(folder) / "single.pt", ctx.rank))
    for one in (sharded, back):
        one.update(full, torch.Generator().manual_seed(3), rows)
    out["fourth"] = [_flat(policy), _flat(back.replica)]
    return out


def _through_file(state: dict, path: Path, rank: int) -> dict:
    """`state` as every rank reads it back from the file that rank 0 writes."""
    if rank == 0:
        torch.save(state, path)
    dist.barrier()
    return torch.load(path, weights_only=True)


def _count_calls(obj, name: str) -> dict:
    """Count calls of obj.name (an instance attribute wrapping the bound method)."""
    counter, method = {"n": 0}, getattr(obj, name)

    def counted(*args, **kwargs):
        counter["n"] += 1
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return counter

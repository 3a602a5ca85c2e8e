"""The policy update sharded with FSDP (torch's `fully_shard`): `train.sharding=fsdp` in a multi-process run.

With `train.sharding=replicate` (the default) every rank of a `DistributedRLTrainer` holds the policy's
weights, gradients and AdamW state in full: 16 bytes per parameter in float32, 112 GB for a 7B policy, more
than one GPU has. Under `fsdp` a rank still keeps its full replica of the policy for what it does alone
(its rollout engine's weights, the recompute of pi_old and of the hidden states that fill its drafter buffer,
the embedding and LM head its EAGLE drafter reads), so that none of it waits on another rank; but the update
runs on `ShardedPolicy`, a copy whose parameters, gradients and AdamW state are split across the N ranks:
FSDP gathers one decoder layer's weights for its forward and backward and reduce-scatters its gradients.
After the update the full weights are gathered into the replica, which is then pushed as before. Per rank
that is the replica (4 bytes per parameter) plus 16 / N bytes, instead of 16 bytes.

The update is the replicated one (`data_parallel.update_policy_sharded`): the same minibatches, rows dealt
to the ranks by length, each rank's token-sum loss over the minibatch's global token count, gradients
summed over ranks (FSDP's reduce-scatter with divide factor 1), the global grad norm and clip, AdamW; the
result equals it up to float summation order. FSDP needs every rank to run as many forwards, so a rank with
fewer micro-batches in a minibatch adds passes of weight 0 (`grpo.accumulate_loss`, `passes`).

Checkpoints hold the optimizer state gathered into the replicated layout (integer keys in parameter order,
full tensors), so a checkpoint resumes under either `train.sharding`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from tlt.config import GRPOConfig
from tlt.training.grpo import (
    GRPOBatch,
    GRPOModule,
    HiddenAndLogits,
    UpdateStats,
    decoder_layers,
    update_policy,
)


class ShardedPolicy:
    """The FSDP training copy of `replica` (an HF causal LM), its GRPO module and AdamW; collective: every
    rank of the default process group builds it and calls `update` and `optimizer_state` together.

    Args:
        replica: this rank's full policy; `update` writes the new weights into it.
        cfg, temperature, reference: those of the replica's `GRPOModule` (the reference only serves
            the recompute, which runs on the replica).
    """

    def __init__(
        self,
        replica: torch.nn.Module,
        cfg: GRPOConfig,
        temperature: float,
        reference: torch.nn.Module | None = None,
    ):
        self.replica = replica
        device = next(replica.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        wrapped = HiddenAndLogits(copy.deepcopy(replica))
        for layer in decoder_layers(wrapped.lm):
            fully_shard(layer, mesh=mesh)
        fully_shard(wrapped, mesh=mesh)  # the rest: embedding, final norm, LM head
        for part in wrapped.modules():
            if isinstance(part, FSDPModule):
                part.set_gradient_divide_factor(1.0)  # sum over ranks: each rank's loss is its share of the sum
                part.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
        self.module = GRPOModule(wrapped, cfg, temperature, reference)
        self.optimizer = self.module.configure_optimizers()

    def update(
        self, batch: GRPOBatch, generator: torch.Generator, rows_here: Callable[[torch.Tensor], torch.Tensor]
    ) -> UpdateStats:
        """`grpo.update_policy` over the global `batch` (every rank's rows), this rank backpropagating
        `rows_here(minibatch)`; then the new weights are gathered into the replica."""
        passes = partial(_most_over_ranks, batch.input_ids.device)
        stats = update_policy(self.module, self.optimizer, batch, generator, rows_here, _sum_over_ranks, passes)
        self._gather_into_replica()
        return stats

    @torch.no_grad()
    def _gather_into_replica(self) -> None:
        for full, part in zip(self.replica.parameters(), self.module.policy.lm.parameters(), strict=True):
            full.copy_(part.full_tensor())

    def optimizer_state(self) -> dict:
        """The optimizer's state dict as a replicated policy's AdamW would have it: full tensors, on CPU, copies
        (collective: the ranks gather each sharded tensor together)."""
        state = self.optimizer.state_dict()
        full = {index: {k: _full_copy(v) for k, v in entry.items()} for index, entry in sorted(state["state"].items())}
        return {"state": full, "param_groups": copy.deepcopy(state["param_groups"])}

    def load_optimizer_state(self, state: dict) -> None:
        """Load a replicated layout's optimizer state (`optimizer_state`, or a replicated run's), each rank
        keeping its shard of every tensor shaped like its parameter."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]  # state_dict's order
        sharded = {
            index: {key: _shard_like(value, params[int(index)]) for key, value in entry.items()}
            for index, entry in state["state"].items()
        }
        self.optimizer.load_state_dict({"state": sharded, "param_groups": state["param_groups"]})


def _full_copy(value):
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    return value.detach().cpu().clone() if torch.is_tensor(value) else value


def _shard_like(value, param: DTensor):
    """A full tensor shaped like `param` as a DTensor split like it (taken from this rank's copy, no
    communication); anything else (AdamW's step count) as a copy: the optimizer steps it in place."""
    if not torch.is_tensor(value):
        return value
    if value.dim() == 0 or tuple(value.shape) != tuple(param.shape):
        return value.clone()
    return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)


def _sum_over_ranks(sums: torch.Tensor) -> torch.Tensor:
    """The loss sums over ranks (FSDP has already summed the gradients)."""
    dist.all_reduce(sums)
    return sums


def _most_over_ranks(device: torch.device, count: int) -> int:
    """The most micro-batches any rank has in this minibatch: the forward + backward passes every rank runs."""
    most = torch.tensor(count, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most)

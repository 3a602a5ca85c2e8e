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
full tensors), so a checkpoint resumes under either `train.sharding`: `torch.distributed.checkpoint.state_dict`
gathers and shards it, keyed by parameter name, which `ShardedPolicy` maps to and from the integer keys.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

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
        """The optimizer's state dict as a replicated policy's AdamW has it (integer keys in parameter order, full
        tensors on CPU) on rank 0, {} on the others (collective: the ranks gather each sharded tensor together)."""
        if not self.optimizer.state:  # never stepped (DCP would initialise the state by a step at lr 0)
            return copy.deepcopy(self.optimizer.state_dict())
        state = get_optimizer_state_dict(self.module.policy, self.optimizer, options=_SAVE)
        if not state:
            return state
        names = [name for group in state["param_groups"] for name in group["params"]]
        return _rekeyed(state, {name: index for index, name in enumerate(names)})

    def load_optimizer_state(self, state: dict) -> None:
        """Load rank 0's `state` (`optimizer_state`, or a replicated run's) into every rank's shards
        (collective: rank 0 broadcasts each tensor; the other ranks' `state` is not read)."""
        names = {param: name for name, param in self.module.policy.named_parameters()}
        order = [names[param] for group in self.optimizer.param_groups for param in group["params"]]
        by_name = _rekeyed(state, dict(enumerate(order))) if dist.get_rank() == 0 else {}
        set_optimizer_state_dict(self.module.policy, self.optimizer, by_name, options=_LOAD)


# Full tensors: gathered onto rank 0's CPU to save, broadcast from rank 0 to load (every rank keeps its shard).
_SAVE = StateDictOptions(full_state_dict=True, cpu_offload=True)
_LOAD = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def _rekeyed(state: dict, new_key: dict) -> dict:
    """An optimizer state dict with parameter key `k` replaced by `new_key[k]` (DCP keys by parameter name,
    `Optimizer.state_dict` by position in the param groups)."""
    groups = [{**group, "params": [new_key[k] for k in group["params"]]} for group in state["param_groups"]]
    entries = {new_key[k]: _own_scalars(entry) for k, entry in state["state"].items()}
    return {"state": entries, "param_groups": groups}


def _own_scalars(entry: dict) -> dict:
    """A parameter's state with copies of its 0-dim tensors (AdamW's step count): DCP passes them through as
    they are, both ways, and the optimizer increments its step in place."""
    return {
        key: value.clone() if torch.is_tensor(value) and value.dim() == 0 else value for key, value in entry.items()
    }


def _sum_over_ranks(sums: torch.Tensor) -> torch.Tensor:
    """The loss sums over ranks (FSDP has already summed the gradients)."""
    dist.all_reduce(sums)
    return sums


def _most_over_ranks(device: torch.device, count: int) -> int:
    """The most micro-batches any rank has in this minibatch: the forward + backward passes every rank runs."""
    most = torch.tensor(count, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most)

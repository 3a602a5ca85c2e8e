"""Multi-process TLT RL on torch.distributed: N ranks, one rollout engine each, one policy (DESIGN.md,
"Distributed model"). The same code runs on gloo (CPU) and nccl (one GPU per rank).

Per RL step, every rank of the default process group (`RLTrainer.step` with `DistributedRLTrainer`'s hooks):

1. draws the same `rollout.prompts_per_step` problems (the same seeded sampler on every rank) and rolls out
   its contiguous share of them (`shard`: whole groups, never split) with its own engine and a rank-specific
   sampling seed; then, still alone, computes its samples' rewards and group advantages and recomputes
   pi_old and the hidden states of its rows, which fill its own drafter buffer;
2. trains its drafter replica in idle time (`SpotWorker`): under `scheduler.policy=spot` a rank whose share
   (rollout and local work) is done trains until every rank's rollout is done (the last rank's recompute
   runs alone); `between_steps` trains the budget after that; `never`
   (or SD off) only waits. The wait goes through the store, so no collective sits behind a long rollout.
   The replicas are then reconciled (step-weighted average): every rank holds the same drafter;
3. updates the policy data-parallel (`update_policy_sharded`): the ranks' rows are all-gathered
   (`gather_rows`: token ids, masks, advantages, old log-probs; a few hundred KB), each minibatch is the same
   set of global rows as in one process (one seeded permutation of the global batch, the same on every
   rank), and its rows are dealt to the ranks by length (`balanced_share`), not by who sampled them; a rank
   back-propagates its rows' token-sum loss divided by the minibatch's global token count and the
   gradients are summed (all_reduce), so the token-mean loss, its gradient, the clipping norm and the AdamW
   step are those of one process over the same rollouts (up to float summation order), and every rank
   takes the same step: the policies stay identical;
4. pushes the same policy and drafter to its engine, at the same version;
5. all-gathers its part of the metrics (`rl_loop.RankPart`); `rl_loop.combine` merges them (rank 0 logs them).

Metrics of a multi-process step: sample statistics (reward, lengths, accept length, log-prob gap, buffer
samples) are over all ranks' samples; `rollout_seconds` is the slowest rank's generate, `train_seconds`
the slowest rank's rewards + recompute plus the slowest policy update, `drafter_seconds` the drafter time
outside the rollout wait (the last rank's wait for reconciliation after its share: under `spot` what is
left of the other ranks' preemption once its recompute is done, under `between_steps` the budget),
`push_seconds` the slowest push. `drafter_steps` counts the micro-steps of all ranks that entered the
reconciled drafter, `spot_steps` those run while another rank still rolled out; `idle_seconds` sums each
rank's wait from its own share's end to the end of the step's rollout (under `spot`: of every rank's
generation; otherwise of every rank's share), `idle_train_seconds` the part of it spent training the drafter.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tlt.config import ConfigError, RunConfig
from tlt.data.rewards import math_rewards
from tlt.data.tasks import MathProblem
from tlt.drafters.base import Drafter
from tlt.schedulers.idle import IdleScheduler, Policy
from tlt.training.checkpoint import RANK_LOCAL, rng_state, save_checkpoint
from tlt.training.distributed.fsdp import ShardedPolicy
from tlt.training.drafter.spot import DrafterStepper, SpotWorker
from tlt.training.grpo import GRPOBatch, GRPOModule, UpdateStats, update_policy
from tlt.training.rl_loop import Overlap, RankPart, RewardFn, RLTrainer, Share, sharding_error

POLL_SECONDS = 0.001  # the store wait of a step without drafter training
GATHERED = ("input_ids", "attention_mask", "response_mask", "advantages", "old_logprobs", "ref_logprobs")


def shard(num_prompts: int, rank: int, world_size: int) -> tuple[int, int]:
    """(first prompt, prompt count) of `rank`'s share: contiguous, sizes differing by at most one, the first
    num_prompts % world_size ranks one larger."""
    base, extra = divmod(num_prompts, world_size)
    return rank * base + min(rank, extra), base + int(rank < extra)


# ---- the data-parallel policy update --------------------------------------------------------------------


def gather_rows(batch: GRPOBatch) -> GRPOBatch:
    """Every rank's rows of the step in rank order, right-padded to the longest, on every rank (collective).
    Old and reference log-probs come along; the engine's (diagnostics only) do not.

    Tensor collectives on the batch's device (gloo on CPU, nccl on GPUs): the ranks first exchange their
    (rows, width), then all_gather each field zero-padded to the largest share, and keep each rank's own rows.
    """
    world_size = dist.get_world_size()
    device = batch.input_ids.device
    shape = torch.tensor(batch.input_ids.shape, dtype=torch.long, device=device)  # [2] rows, width
    shapes = [torch.empty_like(shape) for _ in range(world_size)]
    dist.all_gather(shapes, shape)
    rows = [int(s[0]) for s in shapes]
    most, width = max(rows), max(int(s[1]) for s in shapes)

    def cat(name: str) -> torch.Tensor | None:
        mine = getattr(batch, name)
        if mine is None:  # the same on every rank: one config decides
            return None
        flag = mine.dtype == torch.bool  # moved as uint8: not every backend reduces or gathers bool
        mine = mine.to(torch.uint8) if flag else mine
        columns = width - 1 if name.endswith("_logprobs") else width  # log-probs are [B, T - 1]
        padding = (
            (0, columns - mine.shape[1], 0, most - mine.shape[0]) if mine.dim() == 2 else (0, most - mine.shape[0])
        )
        padded = F.pad(mine, padding).contiguous()
        parts = [torch.empty_like(padded) for _ in range(world_size)]
        dist.all_gather(parts, padded)
        out = torch.cat([part[:n] for part, n in zip(parts, rows, strict=True)])
        return out.bool() if flag else out

    return GRPOBatch(**{name: cat(name) for name in GATHERED})


def balanced_share(lengths: torch.Tensor, index: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    """This rank's rows of a minibatch `index` [b]: rows longest first, each to the rank with the fewest
    tokens so far (longest-processing-time first; ties to the lower row and rank), the same on every rank;
    -> [b_rank] row indices in increasing order."""
    load = [0] * world_size
    mine = []
    for row in sorted(index.tolist(), key=lambda i: (-int(lengths[i]), i)):
        to = min(range(world_size), key=lambda k: (load[k], k))
        load[to] += int(lengths[row])
        if to == rank:
            mine.append(row)
    return torch.tensor(sorted(mine), dtype=torch.long)


def update_policy_sharded(
    module: GRPOModule, optimizer: torch.optim.Optimizer, batch: GRPOBatch, generator: torch.Generator
) -> UpdateStats:
    """`grpo.update_policy` over the step's global `batch` (every rank's rows, `gather_rows`), its work
    shared by the ranks (collective: every rank of the default group calls it).

    The minibatches are those of one process (`cfg.epochs` seeded permutations of the global rows, split in
    `cfg.minibatch_size`; `generator` advances as there). Each minibatch's rows are dealt to the ranks by
    length (`balanced_share`), so a rank holding the long tail's rows does not keep the others waiting at the
    all_reduce. A rank backpropagates token_sum(loss over its rows) / (response tokens of the minibatch); the
    summed gradients are the single-process gradient of the minibatch's token-mean loss. A parameter gets a
    gradient if any rank's rows gave it one (else it stays None, as in one process, so AdamW skips it).
    Stats are global too.
    """
    params = [p for p in module.policy.parameters() if p.requires_grad]
    return update_policy(
        module,
        optimizer,
        batch,
        generator,
        rows_here=rows_by_length(batch),
        sum_over_workers=lambda sums: _sum_gradients(params, sums),
    )


def rows_by_length(batch: GRPOBatch) -> Callable[[torch.Tensor], torch.Tensor]:
    """minibatch index -> this rank's rows of it (`balanced_share` by the rows' token counts)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    lengths = batch.attention_mask.sum(1).cpu()  # [B] tokens per row
    return partial(balanced_share, lengths, world_size=world_size, rank=rank)


@torch.no_grad()
def _sum_gradients(params: list[torch.Tensor], extra: torch.Tensor) -> torch.Tensor:
    """Sum every parameter's gradient over ranks in place (a missing one counts as 0 and stays None if no
    rank has one); returns `extra` ([k] float64) summed over ranks too."""
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float64, device=extra.device)
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
    )  # [P] float32
    small = torch.cat([extra, has])  # [k + n_params]
    dist.all_reduce(flat)
    dist.all_reduce(small)
    any_grad = small[extra.numel() :] > 0
    chunks = flat.split([p.numel() for p in params])
    for p, chunk, keep in zip(params, chunks, any_grad.tolist(), strict=True):
        if not keep:
            p.grad = None
        elif p.grad is None:
            p.grad = chunk.view_as(p).to(p.dtype).clone()
        else:
            p.grad.copy_(chunk.view_as(p))
    return small[: extra.numel()]


# ---- the trainer ------------------------------------------------------------------------------------------


class _LossRecorder:
    """A `DrafterStepper` seen by `SpotWorker`, recording each micro-step's loss."""

    def __init__(self, stepper: DrafterStepper):
        self.stepper, self.losses = stepper, []

    @property
    def head(self):
        return self.stepper.head

    def step(self, stop: Callable[[], bool] | None = None) -> float:
        loss = self.stepper.step(stop)
        self.losses.append(loss)
        return loss

    def reset(self) -> None:
        self.stepper.reset()

    def budget(self) -> int:
        return self.stepper.budget()


class DistributedRLTrainer(RLTrainer):
    """`RLTrainer` on one rank of the default process group; `step` is collective (module doc).

    Args: those of `RLTrainer`, plus `store`: shared by all ranks (`WorkerContext.store`), for the "all
    shares done" flags. Every rank builds it from the same policy, drafter and config.

    Under `train.sharding=fsdp` the update runs on a `fsdp.ShardedPolicy` (its optimizer is `optimizer`), and
    `state_dict` is collective too.
    """

    SHARDINGS = ("replicate", "fsdp")

    def __init__(
        self,
        cfg: RunConfig,
        policy: torch.nn.Module,
        tokenizer,
        problems: Sequence[MathProblem],
        drafter: Drafter | None = None,
        reward_fn: RewardFn = math_rewards,
        device: torch.device | str = "cpu",
        *,
        store: dist.Store,
    ):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        check_world(cfg, self.world_size)
        super().__init__(cfg, policy, tokenizer, problems, drafter, reward_fn, device)
        self.store = store
        self.sharded = None
        if cfg.train.sharding == "fsdp":
            self.sharded = ShardedPolicy(self.policy, cfg.grpo, cfg.rollout.temperature, self.module.reference)
            self.optimizer = self.sharded.optimizer
        self.recorder = None if self.stepper is None else _LossRecorder(self.stepper)
        self.spot = None
        if self.recorder is not None:
            scheduler = IdleScheduler.from_config(cfg.scheduler, self.world_size)
            self.spot = SpotWorker(self.recorder, store, scheduler)

    def _share(self, problems: list[MathProblem], start: float) -> tuple[Share, Overlap]:
        """This rank's share of the prompts rolled out and prepared, then the wait for every rank's, training
        the drafter in it (`SpotWorker`; module doc, 1-2)."""
        first, count = shard(len(problems), self.rank, self.world_size)
        mine = problems[first : first + count]
        if self.spot is None:
            share = self._prepare(self._generate(mine, start))
            return share, Overlap(idle=self._wait_for_all())
        self.recorder.losses.clear()
        spot = self.spot.run_step(lambda: self._generate(mine, start), self._prepare, self._write_drafter_checkpoint)
        ok = spot.error is None
        in_idle = ok and self.spot.scheduler.policy is Policy.SPOT  # spot: every micro-step is in idle time
        overlap = Overlap(
            idle=spot.stats.idle_seconds,
            idle_train=spot.stats.train_seconds if in_idle else 0.0,
            drafter_steps=spot.weights[self.rank],
            spot_steps=spot.stats.micro_steps if in_idle else 0,
            losses=list(self.recorder.losses) if ok else [],
        )
        return spot.rollout, overlap

    def _update(self, batch: GRPOBatch) -> UpdateStats:
        """The data-parallel policy update over every rank's rows (collective)."""
        batch = gather_rows(batch)
        if self.sharded is None:
            return update_policy_sharded(self.module, self.optimizer, batch, self.generator)
        return self.sharded.update(batch, self.generator, rows_by_length(batch))

    def _train_drafter(self, step_seconds: float) -> list[float]:
        return []  # trained in the wait (`_share`)

    def _gather(self, part: RankPart) -> list[RankPart]:
        """Every rank's part; a suffix drafter's history takes in the other ranks' responses of the step."""
        parts: list[RankPart | None] = [None] * self.world_size
        dist.all_gather_object(parts, part)
        if self.suffix is not None:
            for rank, other in enumerate(parts):
                if rank != self.rank:
                    self.suffix.add_history(other.responses)
        return parts

    def _optimizer_state(self) -> dict:
        return super()._optimizer_state() if self.sharded is None else self.sharded.optimizer_state()

    def _load_optimizer_state(self, state: dict) -> None:
        if self.sharded is None:
            super()._load_optimizer_state(state)
        else:
            self.sharded.load_optimizer_state(state)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.spot is not None:
            self.spot.step = self.step_index  # store keys stay unique per step across a resume

    def rank_state(self, state: dict) -> dict:
        """What only this rank has in its `state_dict()` (its tuner, drafter buffer and drafter optimizer), and
        its RNG, on CPU."""
        return _to_cpu({"trainer": {k: state[k] for k in RANK_LOCAL}, "rng": rng_state()})

    def _rollout_seed(self) -> int:
        """Each rank samples its share from its own stream (at N = 1 the single-process seed)."""
        return super()._rollout_seed() * self.world_size + self.rank

    def _wait_for_all(self) -> float:
        """Count this rank's share done in the store and poll until every rank's is; returns the seconds
        waited. (A collective would time out behind a long rollout; the store has no deadline here.)"""
        key = f"shares/{self.step_index}"
        if self.rank == 0 and self.step_index > 0:
            self.store.delete_key(f"shares/{self.step_index - 1}")  # everyone is past it (last update)
        start = time.monotonic()
        self.store.add(key, 1)
        while self.store.add(key, 0) < self.world_size:
            time.sleep(POLL_SECONDS)
        return time.monotonic() - start


def check_world(cfg: RunConfig, world_size: int) -> None:
    """What a run of `world_size` processes needs beyond one process's checks; raises ConfigError."""
    if cfg.train.sharding == "fsdp" and world_size == 1:
        raise ConfigError(sharding_error(cfg))
    if cfg.rollout.prompts_per_step < world_size:
        raise ConfigError(
            f"rollout.prompts_per_step: got {cfg.rollout.prompts_per_step} for {world_size} processes; each "
            f"rank rolls out whole groups, so it needs at least {world_size} (one prompt per rank)"
        )


# ---- checkpoints and consistency ------------------------------------------------------------------------


def save_distributed_checkpoint(output_dir, trainer: DistributedRLTrainer, metrics: list[dict]) -> None:
    """Collective: rank 0 gathers every rank's own state and writes the checkpoint (`save_checkpoint`)."""
    state = trainer.state_dict()  # collective under train.sharding=fsdp
    gathered = [None] * trainer.world_size if trainer.rank == 0 else None
    dist.gather_object(trainer.rank_state(state), gathered, dst=0)
    if trainer.rank == 0:
        save_checkpoint(output_dir, trainer, metrics, ranks=gathered, state=state)


def weights_digest(trainer: RLTrainer) -> str:
    """SHA-256 of the policy's and the drafter's tensors (names, dtypes, shapes, bytes): equal on two ranks
    exactly when their replicas are bit-identical."""
    h = hashlib.sha256()
    modules = [("policy", trainer.policy)]
    if trainer.drafter is not None:
        parts = sorted(vars(trainer.drafter).items())
        modules += [(k, v) for k, v in parts if isinstance(v, torch.nn.Module)]
    for prefix, module in modules:
        for name, tensor in sorted(module.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            h.update(f"{prefix}.{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_cpu(v) for v in tree)
    return tree

"""Spot training of the EAGLE drafter on idle workers, across processes on torch.distributed.

TLT (Hu et al., 2025, https://arxiv.org/abs/2511.16665, sec. 4): a rank whose rollout share is done trains
the drafter until the rollout has ended on every rank. Per RL step, on every rank (`SpotWorker.run_step`):

1. its rollout share (a callable); a rank still rolling out never trains, so training never delays it;
2. it counts itself done in a shared `torch.distributed.Store`; the last rank to finish sets the step's
   "all done" flag: the step's rollout has ended;
3. its local work on the share (`prepare`: rewards, recompute of pi_old and the hidden states that fill the
   drafter buffer), after the count, so the last rank's own recompute is not counted as rollout and no rank
   trains the drafter while it runs (on a CPU the two would share memory bandwidth), and a preempted
   micro-step ends while that recompute runs;
4. while the `IdleScheduler` allows, one drafter micro-step, then a poll of the flag. Under `spot` the
   flag is also polled between the micro-step's chunks of `drafter.preempt_tokens`, and a raised flag ends
   the micro-step early (it steps on the chunks done): preemption waits for at most one chunk
   (`between_steps` waits for the flag, then trains its budget of whole micro-steps);
5. reconciliation (collective): ranks agree on (micro-steps, failed) per rank, then the trainable head
   parameters become the step-weighted average, sum_r steps_r * theta_r / sum_r steps_r (all_reduce of
   theta * steps), so every rank ends with the same drafter. A rank whose micro-step raised falls back to the
   drafter it had before the step and contributes weight 0; with no successful step anywhere the previous
   drafter stays. The rollout result is returned either way.

The same code runs on gloo (CPU) and nccl (GPU: the head lives on the rank's GPU). Optimizer state stays
local to each rank (as in local SGD); a rank that failed restarts its optimizer.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from tlt.config import DrafterConfig
from tlt.drafters.eagle_head import EagleHead
from tlt.schedulers.idle import IdleScheduler, Policy, WorkerStats, WorkerStatus
from tlt.training.drafter.buffer import DrafterBuffer
from tlt.training.drafter.module import BufferBatches, DrafterModule

log = logging.getLogger(__name__)
POLL_SECONDS = 0.001  # `between_steps`: wait between polls of the "all done" flag


class DrafterStepper:
    """One AdamW step of the head per call, on a batch of about cfg.batch_tokens drawn from `buffer`.

    EAGLE-1 loss of `DrafterModule`, gradient clipping at 1.0 as in offline training, learning rate
    cfg.online_lr (cfg.lr when unset) after a linear warm-up over cfg.online_warmup_steps (online training has
    no end to decay towards): `scheduler` steps after each optimizer step. The warm-up counts the optimizer's
    own steps (a loaded optimizer state sets it), so it resumes with the optimizer and restarts with a fresh one
    (`reset`): a fresh AdamW moves every weight by about lr on its first
    steps whatever the gradient, which knocked a trained head from 3.6 to 2.4 tokens per verify in two steps at
    lr 1e-3 (eval/drift.py). `budget()` caps the micro-steps of one RL step at cfg.max_epochs_per_step passes
    over the buffer: early on, when the buffer holds one step's rollouts, more steps than that only overfit the
    head to them.
    """

    def __init__(self, head: EagleHead, buffer: DrafterBuffer, cfg: DrafterConfig):
        self.module = DrafterModule(head, cfg, max_steps=1)
        self.buffer = buffer
        self.batches = iter(BufferBatches(buffer, cfg.batch_tokens, cfg.packing))
        self.reset()

    @property
    def head(self) -> EagleHead:
        return self.module.head

    def reset(self) -> None:
        """Fresh optimizer state and warm-up (after a failed step left them suspect), head in eval mode."""
        self.head.eval()
        cfg = self.module.cfg
        peak = cfg.lr if cfg.online_lr is None else cfg.online_lr
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=peak, weight_decay=0.0)
        self.scheduler = LambdaLR(self.optimizer, self._warmup)
        self.optimizer.register_load_state_dict_pre_hook(self._load_scheduler)

    def budget(self) -> int:
        """Micro-steps this RL step may take: cfg.max_epochs_per_step passes over the buffer's tokens."""
        cfg = self.module.cfg
        return math.ceil(cfg.max_epochs_per_step * self.buffer.num_tokens / cfg.batch_tokens)

    def _warmup(self, taken: int) -> float:
        """The peak learning rate's factor after `taken` optimizer steps: (taken + 1) / cfg.online_warmup_steps,
        at most 1."""
        return min(1.0, (taken + 1) / max(1, self.module.cfg.online_warmup_steps))

    def _load_scheduler(self, optimizer: torch.optim.Optimizer, state: dict) -> dict:
        """Optimizer load_state_dict pre-hook: the warm-up resumes at the saved state's step count, with this
        config's learning rate (the saved groups' lr is the previous step's)."""
        taken = max((int(s["step"]) for s in state["state"].values()), default=0)
        self.scheduler = LambdaLR(optimizer, self._warmup, last_epoch=taken - 1)  # sets the lr of step taken + 1
        return {**state, "param_groups": optimizer.state_dict()["param_groups"]}

    def step(self, stop: Callable[[], bool] | None = None) -> float:
        """One optimizer step; returns its loss (the token mean over the rows it trained on).

        The batch runs in row chunks of about cfg.preempt_tokens padded tokens, accumulating token-sum
        gradients. `stop` is asked after each chunk but the last; when it says True, the step is taken on the
        chunks done so far (their token-mean loss), so a preempted worker returns after one chunk, not one
        whole micro-step (on the 8-layer `small` policy a 4096-token micro-step takes ~0.8 s). Without a stop,
        the step is the whole batch's (up to float summation order). A batch without loss tokens takes no step.
        """
        batch = next(self.batches).to(self.head.fc.weight.device)
        chunks = batch.row_chunks(self.module.cfg.preempt_tokens)
        self.head.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, tokens = 0.0, 0
        for i, chunk in enumerate(chunks):
            n = chunk.num_loss_tokens
            if n:
                loss = self.module.batch_loss(chunk).loss * n  # token sum
                loss.backward()
                loss_sum, tokens = loss_sum + loss.item(), tokens + n
            if stop is not None and i + 1 < len(chunks) and stop():
                break
        if tokens:
            for p in self.head.parameters():
                if p.grad is not None:
                    p.grad.div_(tokens)
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
        self.head.eval()
        return loss_sum / max(tokens, 1)


@dataclass
class SpotResult:
    """What one rank's `run_step` did."""

    rollout: Any  # what this rank's rollout callable returned
    stats: WorkerStats  # this rank's idle / training accounting
    weights: list[int]  # [W] micro-steps each rank contributed to the reconciled drafter (0 = excluded)
    error: str | None = None  # traceback of this rank's failed micro-step (its replica fell back)


class SpotWorker:
    """One rank's side of spot training; every rank of the default process group runs `run_step` together.

    Args:
        stepper: trains this rank's drafter replica (`stepper.head`) one micro-step per call.
        store: shared by all ranks (e.g. `WorkerContext.store`); keys live under "spot/<step>/".
        scheduler: this rank's IdleScheduler (policy and `between_steps` budget) over all ranks.
    """

    def __init__(self, stepper: DrafterStepper, store: dist.Store, scheduler: IdleScheduler):
        self.stepper, self.store, self.scheduler = stepper, store, scheduler
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if scheduler.num_workers != self.world_size:
            raise ValueError(f"scheduler has {scheduler.num_workers} workers, the process group {self.world_size}")
        self.step = 0  # RL steps run so far (the same on every rank)

    def run_step(
        self,
        rollout: Callable[[], Any],
        prepare: Callable[[Any], Any] | None = None,
        rollout_over: Callable[[], None] | None = None,
    ) -> SpotResult:
        """This rank's rollout share, its local work, drafter training in its idle time, then reconciliation
        (collective). `prepare(rollout())` (identity by default) runs after this rank has counted its
        rollout done; `SpotResult.rollout` is what it returns. `rollout_over()` runs once, as soon as this
        rank knows every rank's rollout has ended: at once on the last rank to finish, else when its
        training stops."""
        params = list(self.stepper.head.parameters())
        for r in range(self.world_size):  # the step starts for everyone at the previous sync point
            self.scheduler.worker_started(r)
        previous = _flatten(params)  # [P] a copy of this rank's drafter before the step
        out = rollout()
        last = self._count_done()
        if last and rollout_over is not None:
            rollout_over()
        if prepare is not None:
            out = prepare(out)
        self.scheduler.worker_finished(self.rank)  # idle from now; `_train` polls the other ranks' flag first
        error = self._train()
        if not last and rollout_over is not None:
            rollout_over()
        if error is not None:
            log.warning("rank %d: drafter micro-step failed, keeping the previous drafter:\n%s", self.rank, error)
            _unflatten_into(params, previous)
            self.stepper.reset()
        weights = self._agree(error is not None)
        average_replicas(params, weights, self.rank)
        self._clear()
        self.step += 1
        return SpotResult(out, self.scheduler.stats(self.rank), weights, error)

    def progress(self, rank: int) -> int:
        """Micro-steps `rank` has finished in the current step, as published in the store (monitoring)."""
        key = self._key(f"steps/{rank}")
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def _key(self, name: str) -> str:
        return f"spot/{self.step}/{name}"

    def _count_done(self) -> bool:
        """Count this rank's rollout done; the last one raises the step's "all done" flag and returns True."""
        if self.store.add(self._key("done"), 1) < self.world_size:
            return False
        self.store.set(self._key("all"), "1")
        return True

    def _poll(self, block: bool) -> None:
        """Mark every rank finished once the flag is up (block: wait for it)."""
        if self.scheduler.rollout_done():
            return
        while not self.store.check([self._key("all")]):
            if not block:
                return
            time.sleep(POLL_SECONDS)  # no store timeout: a rollout may take longer than any
        self._all_finished()

    def _rollout_over(self) -> bool:
        """Whether every rank's rollout has ended (asked inside a micro-step: `spot` stops it then)."""
        self._poll(block=False)
        return self.scheduler.rollout_done()

    def _all_finished(self) -> None:
        """Other ranks' exact finish times are not known here; they count as finished now."""
        for r in range(self.world_size):
            if self.scheduler.status(r) is WorkerStatus.ROLLOUT:
                self.scheduler.worker_finished(r)

    def _train(self) -> str | None:
        """Micro-steps while the scheduler allows; returns the traceback of a failed one, else None."""
        self._poll(block=self.scheduler.policy is Policy.BETWEEN_STEPS)
        budget = self.stepper.budget()
        while True:
            self._poll(block=False)
            if self.scheduler.stats(self.rank).micro_steps >= budget:
                self._poll(block=True)  # budget used: wait out the other ranks' rollouts idle
                return None
            if not self.scheduler.should_train(self.rank):
                return None
            try:
                self.stepper.step(self._rollout_over if self.scheduler.policy is Policy.SPOT else None)
            except Exception:
                self.scheduler.micro_step_done(self.rank, ok=False)
                return traceback.format_exc()
            self.scheduler.micro_step_done(self.rank)
            self.store.set(self._key(f"steps/{self.rank}"), str(self.scheduler.stats(self.rank).micro_steps))

    def _agree(self, failed: bool) -> list[int]:
        """[W] weights every rank agrees on: successful micro-steps, 0 for a rank that failed."""
        device = self.stepper.head.fc.weight.device
        table = torch.zeros(self.world_size, 2, dtype=torch.long, device=device)  # [W, (steps, failed)]
        table[self.rank, 0] = self.scheduler.stats(self.rank).micro_steps
        table[self.rank, 1] = int(failed)
        dist.all_reduce(table)
        return (table[:, 0] * (1 - table[:, 1])).tolist()

    def _clear(self) -> None:
        """Rank 0 drops the step's keys; every rank is past its last poll (it joined the collectives)."""
        if self.rank == 0:
            for name in ["done", "all", *(f"steps/{r}" for r in range(self.world_size))]:
                self.store.delete_key(self._key(name))


@torch.no_grad()
def average_replicas(params: list[torch.Tensor], weights: list[int], rank: int) -> None:
    """Replace `params` on every rank by sum_r w_r * theta_r / sum_r w_r (collective; no-op if all w_r = 0).

    weights: [W] the same list on every rank. Accumulates in float32 (bf16 heads are upcast).
    """
    total = sum(weights)
    if total == 0:
        return
    flat = _flatten(params).float() * weights[rank]  # [P]
    dist.all_reduce(flat)
    _unflatten_into(params, flat / total)


def _flatten(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])  # [P]


@torch.no_grad()
def _unflatten_into(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    for p, chunk in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.copy_(chunk.view_as(p))

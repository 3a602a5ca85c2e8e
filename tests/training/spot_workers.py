"""Worker functions for test_spot.py, at module level so spawned children can import them.

`run_scenarios` runs its scenarios in one launch (process start-up dominates the cost), each with its own
store prefix and a fresh SpotWorker, and returns plain data for the parent to check.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tlt.config import DrafterConfig
from tlt.drafters.eagle_head import EagleConfig, EagleHead
from tlt.schedulers.idle import IdleScheduler
from tlt.training.distributed.launch import WorkerContext
from tlt.training.drafter.buffer import DrafterBuffer, DrafterSample
from tlt.training.drafter.spot import DrafterStepper, SpotWorker, average_replicas

HEAD = EagleConfig(
    hidden_size=32,
    vocab_size=64,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    max_position_embeddings=128,
)
CFG = DrafterConfig(lr=1e-2, batch_tokens=64, max_epochs_per_step=100.0)  # the idle time bounds training
CAPPED = DrafterConfig(lr=1e-2, batch_tokens=64)  # 2 passes over a rank's 57 buffer tokens: 2 micro-steps


def flat(head: EagleHead) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in head.parameters()]).clone()  # [P]


def build_head() -> EagleHead:
    """The same initial head on every rank, sharing a fixed random embedding / LM head."""
    torch.manual_seed(0)
    head = EagleHead(HEAD).eval()
    embed = torch.randn(HEAD.vocab_size, HEAD.hidden_size, generator=torch.Generator().manual_seed(1))
    head.share(embed, embed)
    return head


def build_buffer(rank: int) -> DrafterBuffer:
    """Random samples, different on each rank (each rank trains on its own rollouts)."""
    g = torch.Generator().manual_seed(100 + rank)
    samples = []
    for T in (12, 20, 9, 16):
        loss_mask = torch.arange(T) >= 4
        tokens = torch.randint(0, HEAD.vocab_size, (T,), generator=g)
        samples.append(DrafterSample(tokens, torch.randn(T, HEAD.hidden_size, generator=g), loss_mask, 0))
    buffer = DrafterBuffer(max_bytes=10**6, seed=rank)
    buffer.add(samples)
    return buffer


def step_lrs(stepper: DrafterStepper, n: int) -> list[float]:
    """The learning rates the next `n` micro-steps of `stepper` take their optimizer steps with."""
    seen = []
    hook = stepper.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    for _ in range(n):
        stepper.step()
    hook.remove()
    return seen


class RecordingStepper(DrafterStepper):
    """Records the head after each successful step; raises at micro-step `fail_at` (1-based), once it is
    reached, after setting the store key "test/failed" so the other rank can wait for it."""

    def __init__(self, head, buffer, store, fail_at: int | None = None, cfg: DrafterConfig = CFG):
        super().__init__(head, buffer, cfg)
        self.store, self.fail_at, self.calls = store, fail_at, 0
        self.last = flat(head)

    def step(self, stop=None) -> float:
        self.calls += 1
        if self.calls == self.fail_at:
            with torch.no_grad():
                next(self.head.parameters()).add_(1.0)  # a half-done update the fallback must undo
            self.store.set("test/failed", "1")
            raise RuntimeError("injected drafter failure")
        loss = super().step(stop)
        self.last = flat(self.head)
        return loss


def exact_average(ctx: WorkerContext) -> dict:
    """Distinct replicas averaged with weights [3, 5]."""
    head = build_head()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + ctx.rank)))
    before = flat(head)
    average_replicas(list(head.parameters()), [3, 5], ctx.rank)
    return {"before": before, "after": flat(head)}


def spot_step(ctx: WorkerContext, head, buffer, fail_at: int | None, policy: str, prefix: str) -> dict:
    """One RL step. Rank 0 finishes at once; rank 1 rolls out until rank 0 has trained 3 micro-steps (or,
    when rank 0 is set to fail, until it has failed). Under between_steps both finish at once."""
    store = dist.PrefixStore(prefix, ctx.store)
    stepper = RecordingStepper(head, buffer, store, fail_at if ctx.rank == 0 else None)
    worker = SpotWorker(stepper, store, IdleScheduler(policy, ctx.world_size, budget_steps=2))
    start = flat(head)

    def rollout() -> dict:
        if ctx.rank == 1 and policy == "spot":
            while fail_at is None and worker.progress(0) < 3:
                time.sleep(0.001)
            if fail_at is not None:
                store.wait(["test/failed"])
        # rank 0's micro-steps when this rollout ends: it may finish only the one in flight after that
        return {"rank": ctx.rank, "tokens": [ctx.rank, 7, 8], "progress_at_end": worker.progress(0)}

    result = worker.run_step(rollout)
    return {"result": result, "start": start, "trained": stepper.last, "after": flat(head)}


def capped_step(ctx: WorkerContext, head, buffer) -> dict:
    """Rank 1 rolls out until rank 0 has used its budget of 2 micro-steps, then 0.3 s more idle time."""
    store = dist.PrefixStore("s5", ctx.store)
    stepper = RecordingStepper(head, buffer, store, cfg=CAPPED)
    worker = SpotWorker(stepper, store, IdleScheduler("spot", ctx.world_size))

    def rollout() -> int:
        if ctx.rank == 1:
            while worker.progress(0) < 2:
                time.sleep(0.001)
            time.sleep(0.3)  # idle time rank 0 must not fill: its budget is spent
        return ctx.rank

    return {"result": worker.run_step(rollout), "budget": stepper.budget()}


def prepare_step(ctx: WorkerContext, head, buffer) -> dict:
    """Rank 1 rolls out until rank 0 has trained 2 micro-steps, then prepares (its recompute) for 0.5 s,
    long enough for dozens more micro-steps of this head, and records rank 0's progress around that. Each
    rank records when its `rollout_over` callback ran (and rank 0's progress then)."""
    store = dist.PrefixStore("s6", ctx.store)
    worker = SpotWorker(RecordingStepper(head, buffer, store), store, IdleScheduler("spot", ctx.world_size))
    times: dict[str, float] = {}
    over: list[tuple[float, int]] = []

    def rollout() -> int:
        while ctx.rank == 1 and worker.progress(0) < 2:
            time.sleep(0.001)
        times["rollout_end"] = time.monotonic()
        return ctx.rank

    def prepare(rank: int) -> dict:
        times["prepare_start"] = time.monotonic()
        seen = {"rank": rank, "before": worker.progress(0)}
        if rank == 1:
            time.sleep(0.5)
        seen["after"] = worker.progress(0)
        return seen

    def rollout_over() -> None:
        over.append((time.monotonic(), worker.progress(0)))

    return {"result": worker.run_step(rollout, prepare, rollout_over), "times": times, "over": over}


def run_scenarios(ctx: WorkerContext) -> dict:
    head, buffer = build_head(), build_buffer(ctx.rank)
    out = {"average": exact_average(ctx)}
    out["spot"] = spot_step(ctx, head, buffer, None, "spot", "s1")
    out["spot_fail"] = spot_step(ctx, head, buffer, 2, "spot", "s2")
    out["between_fail"] = spot_step(ctx, head, buffer, 2, "between_steps", "s3")
    out["never"] = spot_step(ctx, head, buffer, None, "never", "s4")
    out["capped"] = capped_step(ctx, head, buffer)
    out["prepare"] = prepare_step(ctx, head, buffer)
    return out

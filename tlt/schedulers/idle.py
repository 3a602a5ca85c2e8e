"""The idle-resource scheduler: which worker trains the drafter, and when it must stop (pure logic, no torch).

TLT (Hu et al., 2025, https://arxiv.org/abs/2511.16665, sec. 4) trains the drafter on workers whose rollout
share is done while others still decode the long tail. Policies:

- `spot` (TLT): a worker trains from its own finish until the rollout has ended on *all* workers. Unlike the
  reference code, which stops at the worker's own rollout end, this covers the long-tail wait, where the idle
  time is. A worker still rolling out never trains, so training never delays the rollout.
- `between_steps` (the overhead baseline): after the rollout has ended everywhere, every worker trains a fixed
  budget of micro-steps, in dedicated time.
- `never`: the drafter stays frozen.

Protocol per RL step: `worker_started(rank)` for each worker, `worker_finished(rank)` as its share ends;
before each drafter micro-step `should_train(rank)`, after it `micro_step_done(rank, ok)`. `stats(rank)`
accounts time and micro-steps. The clock is injectable (tests use a fake one).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tlt.config import SchedulerConfig


class Policy(enum.Enum):
    SPOT = "spot"
    BETWEEN_STEPS = "between_steps"
    NEVER = "never"


class WorkerStatus(enum.Enum):
    WAITING = "waiting"  # has not started this step's rollout share
    ROLLOUT = "rollout"  # decoding its share: never trains
    IDLE = "idle"  # share done, not inside a micro-step
    TRAINING = "training"  # inside a drafter micro-step


@dataclass
class WorkerStats:
    """One worker's accounting for the current (or last) RL step; seconds by the scheduler's clock."""

    rollout_seconds: float = 0.0  # own start -> own share done
    idle_seconds: float = 0.0  # own share done -> rollout done on all workers (so far, while it runs)
    train_seconds: float = 0.0  # inside drafter micro-steps
    micro_steps: int = 0  # successful drafter micro-steps
    failed: bool = False  # a micro-step failed; the worker trains no more this step
    last_step_end: float | None = None  # clock time the last micro-step ended


@dataclass
class _Worker:
    status: WorkerStatus = WorkerStatus.WAITING
    started: float = 0.0
    finished: float | None = None
    step_start: float = 0.0
    stats: WorkerStats = field(default_factory=WorkerStats)


class IdleScheduler:
    """Tracks each worker as waiting, rolling out, idle or training, and decides who trains.

    Args:
        policy: `spot`, `between_steps` or `never`.
        num_workers: workers (ranks) 0..num_workers-1.
        budget_steps: `between_steps` micro-steps per worker after each rollout.
        clock: seconds, monotonic (time.monotonic by default).
    """

    def __init__(
        self,
        policy: str | Policy,
        num_workers: int,
        budget_steps: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ):
        if num_workers < 1:
            raise ValueError(f"IdleScheduler.num_workers must be >= 1, got {num_workers}")
        if budget_steps < 0:
            raise ValueError(f"IdleScheduler.budget_steps must be >= 0, got {budget_steps}")
        self.policy = Policy(policy)
        self.num_workers, self.budget_steps, self.clock = num_workers, budget_steps, clock
        self._workers = [_Worker() for _ in range(num_workers)]
        self._rollout_end: float | None = None

    @classmethod
    def from_config(
        cls, cfg: SchedulerConfig, num_workers: int, clock: Callable[[], float] = time.monotonic
    ) -> IdleScheduler:
        return cls(cfg.policy, num_workers, cfg.between_steps_budget, clock)

    def status(self, rank: int) -> WorkerStatus:
        return self._worker(rank).status

    def rollout_done(self) -> bool:
        """Every worker has finished its share of this step's rollout."""
        return self._rollout_end is not None

    def worker_started(self, rank: int) -> None:
        """`rank` starts its rollout share; the first start after a finished rollout begins a new step."""
        if self.rollout_done():
            self._new_step()
        w = self._worker(rank)
        if w.status is not WorkerStatus.WAITING:
            raise ValueError(f"worker {rank} started twice in one step (status {w.status.value})")
        w.status, w.started = WorkerStatus.ROLLOUT, self.clock()

    def worker_finished(self, rank: int) -> None:
        w = self._worker(rank)
        if w.status is not WorkerStatus.ROLLOUT:
            raise ValueError(f"worker {rank} finished without a running rollout share (status {w.status.value})")
        now = self.clock()
        w.status, w.finished = WorkerStatus.IDLE, now
        w.stats.rollout_seconds = now - w.started
        if all(x.finished is not None for x in self._workers):
            self._rollout_end = now

    def should_train(self, rank: int) -> bool:
        """Whether `rank` may run one drafter micro-step now; True marks the micro-step as started."""
        w = self._worker(rank)
        if w.status is WorkerStatus.TRAINING:
            raise ValueError(f"worker {rank} asked to train inside a micro-step; call micro_step_done first")
        if not self._may_train(w):
            return False
        w.status, w.step_start = WorkerStatus.TRAINING, self.clock()
        return True

    def micro_step_done(self, rank: int, ok: bool = True) -> None:
        """End the micro-step `should_train` started; ok=False benches the worker for the rest of the step."""
        w = self._worker(rank)
        if w.status is not WorkerStatus.TRAINING:
            raise ValueError(f"worker {rank} is not in a micro-step (status {w.status.value})")
        now = self.clock()
        w.stats.train_seconds += now - w.step_start
        w.stats.last_step_end = now
        if ok:
            w.stats.micro_steps += 1
        else:
            w.stats.failed = True
        w.status = WorkerStatus.IDLE

    def stats(self, rank: int) -> WorkerStats:
        """A copy of `rank`'s accounting; idle time runs until the rollout is done on all workers."""
        w = self._worker(rank)
        if w.finished is None:
            return dataclasses.replace(w.stats)
        end = self.clock() if self._rollout_end is None else self._rollout_end
        return dataclasses.replace(w.stats, idle_seconds=end - w.finished)

    def _may_train(self, w: _Worker) -> bool:
        if w.status is not WorkerStatus.IDLE or w.stats.failed:
            return False
        if self.policy is Policy.SPOT:
            return not self.rollout_done()
        if self.policy is Policy.BETWEEN_STEPS:
            return self.rollout_done() and w.stats.micro_steps < self.budget_steps
        return False

    def _new_step(self) -> None:
        busy = [r for r, w in enumerate(self._workers) if w.status is WorkerStatus.TRAINING]
        if busy:
            raise ValueError(f"workers {busy} are still inside a micro-step; call micro_step_done first")
        self._workers = [_Worker() for _ in range(self.num_workers)]
        self._rollout_end = None

    def _worker(self, rank: int) -> _Worker:
        if not 0 <= rank < self.num_workers:
            raise ValueError(f"rank {rank} out of range for {self.num_workers} workers")
        return self._workers[rank]

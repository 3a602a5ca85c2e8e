"""IdleScheduler policies under a fake clock: who trains, when training stops, and the accounting."""

import pytest

from tlt.config import SchedulerConfig
from tlt.schedulers.idle import IdleScheduler, Policy, WorkerStatus


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _started(policy: str, num_workers: int = 3, **kwargs) -> tuple[IdleScheduler, FakeClock]:
    clock = FakeClock()
    sched = IdleScheduler(policy, num_workers, clock=clock, **kwargs)
    for r in range(num_workers):
        sched.worker_started(r)
    return sched, clock


def _micro_step(sched: IdleScheduler, clock: FakeClock, rank: int, seconds: float = 0.5) -> bool:
    if not sched.should_train(rank):
        return False
    clock.advance(seconds)
    sched.micro_step_done(rank)
    return True


def test_spot_trains_only_finished_workers_until_all_finished():
    sched, clock = _started("spot")
    assert not any(sched.should_train(r) for r in range(3))  # everyone is rolling out
    clock.advance(2.0)
    sched.worker_finished(0)
    assert not sched.should_train(1) and not sched.should_train(2)
    assert [_micro_step(sched, clock, 0) for _ in range(3)] == [True] * 3
    sched.worker_finished(1)
    assert _micro_step(sched, clock, 1) and _micro_step(sched, clock, 0)
    assert not sched.should_train(2) and not sched.rollout_done()
    sched.worker_finished(2)  # clock 2 + 5 * 0.5 = 4.5 s after the start
    assert sched.rollout_done()
    assert not any(sched.should_train(r) for r in range(3))  # preempted: the rollout is over
    s0, s1, s2 = (sched.stats(r) for r in range(3))
    assert (s0.micro_steps, s1.micro_steps, s2.micro_steps) == (4, 1, 0)
    assert (s0.rollout_seconds, s0.idle_seconds, s0.train_seconds) == (2.0, 2.5, 2.0)
    assert (s1.rollout_seconds, s1.idle_seconds, s1.train_seconds) == (3.5, 1.0, 0.5)
    assert (s2.rollout_seconds, s2.idle_seconds, s2.train_seconds) == (4.5, 0.0, 0.0)
    assert s0.last_step_end == 104.5 and s2.last_step_end is None


def test_spot_micro_step_in_flight_at_rollout_end_is_the_last():
    sched, clock = _started("spot", num_workers=2)
    sched.worker_finished(0)
    assert sched.should_train(0)
    assert sched.status(0) is WorkerStatus.TRAINING
    clock.advance(1.0)
    sched.worker_finished(1)  # rollout ends while worker 0 is inside a micro-step
    sched.micro_step_done(0)
    assert not sched.should_train(0)
    assert sched.stats(0).micro_steps == 1 and sched.stats(0).idle_seconds == 1.0


def test_spot_single_worker_never_trains():
    sched, _ = _started("spot", num_workers=1)
    sched.worker_finished(0)
    assert sched.rollout_done() and not sched.should_train(0)


def test_between_steps_trains_a_fixed_budget_after_the_rollout():
    sched, clock = _started("between_steps", num_workers=2, budget_steps=3)
    sched.worker_finished(0)
    assert not sched.should_train(0)  # no training while anyone still rolls out
    clock.advance(4.0)
    sched.worker_finished(1)
    assert [_micro_step(sched, clock, 0) for _ in range(4)] == [True, True, True, False]
    assert [_micro_step(sched, clock, 1) for _ in range(4)] == [True, True, True, False]
    s0 = sched.stats(0)
    assert (s0.micro_steps, s0.train_seconds, s0.idle_seconds) == (3, 1.5, 4.0)


def test_never_trains():
    sched, _ = _started("never", num_workers=2)
    sched.worker_finished(0)
    assert not sched.should_train(0)
    sched.worker_finished(1)
    assert not sched.should_train(0) and not sched.should_train(1)


def test_failed_micro_step_benches_the_worker_for_the_step():
    sched, clock = _started("spot", num_workers=2)
    sched.worker_finished(0)
    assert _micro_step(sched, clock, 0)
    assert sched.should_train(0)
    clock.advance(0.25)
    sched.micro_step_done(0, ok=False)
    assert not sched.should_train(0)
    s = sched.stats(0)
    assert (s.micro_steps, s.failed, s.train_seconds) == (1, True, 0.75)


def test_next_step_resets_the_workers():
    sched, clock = _started("spot", num_workers=2)
    sched.worker_finished(0)
    _micro_step(sched, clock, 0)
    sched.worker_finished(1)
    sched.worker_started(1)  # a new step
    assert not sched.rollout_done()
    assert sched.status(0) is WorkerStatus.WAITING and sched.stats(0).micro_steps == 0
    sched.worker_started(0)
    sched.worker_finished(1)
    assert _micro_step(sched, clock, 1)


def test_protocol_errors_are_clear():
    sched, _ = _started("spot", num_workers=2)
    with pytest.raises(ValueError, match="started twice"):
        sched.worker_started(0)
    with pytest.raises(ValueError, match="not in a micro-step"):
        sched.micro_step_done(0)
    sched.worker_finished(0)
    with pytest.raises(ValueError, match="without a running rollout"):
        sched.worker_finished(0)
    assert sched.should_train(0)
    with pytest.raises(ValueError, match="inside a micro-step"):
        sched.should_train(0)
    with pytest.raises(ValueError, match="out of range"):
        sched.status(2)
    with pytest.raises(ValueError):
        IdleScheduler("sometimes", 2)


def test_from_config():
    sched = IdleScheduler.from_config(SchedulerConfig(policy="between_steps", between_steps_budget=5), 4)
    assert (sched.policy, sched.num_workers, sched.budget_steps) == (Policy.BETWEEN_STEPS, 4, 5)

"""Spot training across 2 real processes on gloo: training in the long-tail wait, preemption, exact
step-weighted reconciliation, and a failing rank that keeps its rollout and the previous drafter."""

import io

import pytest
import torch

from tests.training import spot_workers
from tlt.config import ConfigError
from tlt.training.distributed.launch import launch_cpu
from tlt.training.drafter.module import BufferBatches


@pytest.fixture(scope="module")
def runs():
    """Per rank, the scenarios of `spot_workers.run_scenarios` (one launch of two processes)."""
    return launch_cpu(spot_workers.run_scenarios, 2, timeout_s=50)


def test_step_weighted_average_is_exact(runs):
    (a, b) = (r["average"] for r in runs)
    expected = (a["before"] * 3 + b["before"] * 5) / 8
    assert not torch.equal(a["before"], b["before"])
    assert torch.equal(a["after"], expected) and torch.equal(b["after"], expected)


def test_early_rank_trains_during_the_other_ranks_rollout_and_stops_when_it_ends(runs):
    fast, slow = (r["spot"]["result"] for r in runs)
    k = fast.stats.micro_steps
    assert k >= 3 and fast.error is None and not fast.stats.failed
    assert slow.stats.micro_steps == 0  # the last rank to finish never trains under spot
    assert fast.weights == slow.weights == [k, 0]
    # preempted when the other rank's rollout ended: at most the micro-step in flight then still finishes
    # (counts, not clock bounds, so a loaded machine cannot break it)
    assert slow.rollout["progress_at_end"] >= 3 and k <= slow.rollout["progress_at_end"] + 1
    assert fast.stats.idle_seconds > 0 and fast.stats.train_seconds > 0


def test_replicas_end_identical_as_the_step_weighted_average(runs):
    r0, r1 = (r["spot"] for r in runs)
    assert torch.equal(r0["start"], r1["start"])
    k = r0["result"].stats.micro_steps
    expected = (r0["trained"] * k + r1["trained"] * 0) / k  # rank 1 did not train: its replica is the start
    assert torch.equal(r1["trained"], r1["start"]) and not torch.equal(r0["trained"], r0["start"])
    assert torch.equal(r0["after"], expected) and torch.equal(r1["after"], expected)


def test_failing_rank_keeps_its_rollout_and_the_previous_drafter(runs):
    r0, r1 = (r["spot_fail"] for r in runs)
    failed, other = r0["result"], r1["result"]
    assert "injected drafter failure" in failed.error and failed.stats.failed
    assert failed.stats.micro_steps == 1  # one step succeeded before the failure, and is discarded
    assert failed.weights == other.weights == [0, 0]
    assert failed.rollout["tokens"] == [0, 7, 8] and other.rollout["tokens"] == [1, 7, 8]
    previous = runs[0]["spot"]["after"]
    assert torch.equal(r0["start"], previous)
    assert torch.equal(r0["after"], previous) and torch.equal(r1["after"], previous)


def test_failing_rank_is_excluded_and_adopts_the_others_drafter(runs):
    r0, r1 = (r["between_fail"] for r in runs)
    assert r0["result"].error is not None and r1["result"].error is None
    assert r1["result"].stats.micro_steps == 2  # the between_steps budget
    assert r0["result"].weights == r1["result"].weights == [0, 2]
    expected = (r1["trained"] * 2) / 2
    assert torch.equal(r0["after"], expected) and torch.equal(r1["after"], expected)
    assert r0["result"].rollout["tokens"] == [0, 7, 8]


def test_never_keeps_the_drafter(runs):
    r0, r1 = (r["never"] for r in runs)
    assert r0["result"].weights == [0, 0] and r0["result"].stats.micro_steps == 0
    assert torch.equal(r0["after"], r0["start"]) and torch.equal(r1["after"], r0["start"])


def test_micro_steps_per_rl_step_are_capped_at_the_buffers_epochs(runs):
    r0 = runs[0]["capped"]
    assert r0["budget"] == 2  # ceil(2.0 * 57 tokens / 64)
    # the budget, not the idle time, ended its training: rank 1 kept rolling out after rank 0's 2 steps
    assert r0["result"].stats.micro_steps == 2 and r0["result"].weights == [2, 0]


def test_no_rank_trains_during_the_last_ranks_local_work(runs):
    """The step's rollout ends with the last rank's generation: its recompute (`prepare`) runs alone."""
    early, late = (r["prepare"]["result"] for r in runs)
    assert early.rollout["rank"] == 0 and late.rollout["rank"] == 1  # prepare's result is the rollout's
    assert late.rollout["before"] >= 2
    assert late.rollout["after"] - late.rollout["before"] <= 1  # at most the micro-step in flight ends
    assert early.stats.micro_steps == late.rollout["after"] and early.weights == [early.stats.micro_steps, 0]


def test_rollout_over_runs_once_per_rank_when_the_last_rollout_has_ended(runs):
    """The hook that starts the drafter checkpoint write: on the last rank right after its generation, before
    its recompute; on an early rank after its training stopped, not while the other rank still decodes."""
    early, late = (r["prepare"] for r in runs)
    assert len(early["over"]) == len(late["over"]) == 1
    (late_at, _), (early_at, early_progress) = late["over"][0], early["over"][0]
    assert late["times"]["rollout_end"] <= late_at <= late["times"]["prepare_start"]
    assert early_at >= late["times"]["rollout_end"]
    assert early_progress == early["result"].stats.micro_steps  # its training had stopped


def test_budget_grows_with_the_buffer():
    buffer = spot_workers.build_buffer(0)  # 57 tokens
    cfg = spot_workers.CAPPED
    stepper = spot_workers.DrafterStepper(spot_workers.build_head(), buffer, cfg)
    assert stepper.budget() == 2
    buffer.add(list(spot_workers.build_buffer(1).samples) * 3)  # 4 x 57 tokens
    assert stepper.budget() == 8


def _warmup_stepper(online_lr: float | None = None, warmup: int = 4):
    cfg = spot_workers.DrafterConfig(lr=1e-3, online_lr=online_lr, batch_tokens=64, online_warmup_steps=warmup)
    return spot_workers.DrafterStepper(spot_workers.build_head(), spot_workers.build_buffer(0), cfg)


def _documented_lr(cfg, taken: int) -> float:
    """drafter.online_lr (drafter.lr when unset) times the linear warm-up over drafter.online_warmup_steps."""
    peak = cfg.lr if cfg.online_lr is None else cfg.online_lr
    return peak * min(1.0, (taken + 1) / max(1, cfg.online_warmup_steps))


def _saved_and_loaded(state: dict) -> dict:
    """`state` through torch.save / torch.load as the trainer's checkpoint reads it (weights_only)."""
    file = io.BytesIO()
    torch.save(state, file)
    file.seek(0)
    return torch.load(file, weights_only=True)


@pytest.mark.parametrize(("online_lr", "warmup"), [(None, 4), (1e-4, 2), (None, 1), (None, 0)])
def test_learning_rate_warms_up_linearly_then_holds_the_peak(online_lr, warmup):
    stepper = _warmup_stepper(online_lr, warmup)
    cfg = stepper.module.cfg
    assert spot_workers.step_lrs(stepper, 7) == [_documented_lr(cfg, k) for k in range(7)]


def test_learning_rate_values_of_a_four_step_warm_up():
    assert spot_workers.step_lrs(_warmup_stepper(), 5) == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert spot_workers.step_lrs(_warmup_stepper(online_lr=1e-4, warmup=2), 3) == pytest.approx([5e-5, 1e-4, 1e-4])
    with pytest.raises(ConfigError, match="drafter.online_lr"):
        spot_workers.DrafterConfig(online_lr=0.0)


def test_reset_restarts_the_warm_up():
    stepper = _warmup_stepper()
    spot_workers.step_lrs(stepper, 5)
    stepper.reset()  # a fresh optimizer warms up again
    assert spot_workers.step_lrs(stepper, 5) == [_documented_lr(stepper.module.cfg, k) for k in range(5)]


@pytest.mark.parametrize("taken", [0, 2, 6])  # before any step, inside the warm-up, after it
def test_a_resumed_stepper_continues_the_uninterrupted_learning_rates(taken):
    uninterrupted = spot_workers.step_lrs(_warmup_stepper(), 9)
    first = _warmup_stepper()
    before = spot_workers.step_lrs(first, taken)
    resumed = spot_workers.DrafterStepper(first.head, first.buffer, first.module.cfg)
    resumed.optimizer.load_state_dict(_saved_and_loaded(first.optimizer.state_dict()))
    assert before + spot_workers.step_lrs(resumed, 9 - taken) == uninterrupted


@pytest.mark.parametrize("taken", [0, 2, 6])
def test_an_optimizer_state_saved_without_the_scheduler_resumes_the_warm_up_at_its_step_count(taken):
    """The format written before the scheduler: the stepper set each step's lr on a plain AdamW built at
    drafter.lr, so the saved param groups hold the previous step's lr and no scheduler state."""
    resumed = _warmup_stepper(online_lr=5e-4)
    cfg = resumed.module.cfg
    old = torch.optim.AdamW(spot_workers.build_head().parameters(), lr=cfg.lr, weight_decay=0.0)
    for k in range(taken):
        old.param_groups[0]["lr"] = _documented_lr(cfg, k)
        for p in old.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        old.step()
    resumed.optimizer.load_state_dict(_saved_and_loaded(old.state_dict()))
    assert spot_workers.step_lrs(resumed, 4) == [_documented_lr(cfg, k) for k in range(taken, taken + 4)]
    resumed.optimizer.load_state_dict(resumed.optimizer.state_dict())  # saved again: the scheduler's state now
    assert spot_workers.step_lrs(resumed, 2) == [_documented_lr(cfg, k) for k in range(taken + 4, taken + 6)]


def _stepper(preempt_tokens: int):
    """A fresh head and a fresh copy of rank 0's buffer: every call draws the same first batch (4 packed rows
    of 20 tokens)."""
    cfg = spot_workers.DrafterConfig(lr=1e-2, batch_tokens=64, preempt_tokens=preempt_tokens)
    return spot_workers.DrafterStepper(spot_workers.build_head(), spot_workers.build_buffer(0), cfg)


def test_a_chunked_micro_step_equals_the_whole_batch_step():
    whole, chunked = _stepper(4096), _stepper(20)  # 1 chunk vs 4 chunks of one row
    assert whole.step() == pytest.approx(chunked.step(stop=lambda: False), rel=1e-5)
    after = [spot_workers.flat(s.head) for s in (whole, chunked)]
    assert not torch.equal(after[0], spot_workers.flat(spot_workers.build_head()))  # it did train
    torch.testing.assert_close(after[0], after[1], rtol=1e-5, atol=1e-6)


def test_a_preempted_micro_step_steps_on_the_chunks_done():
    preempted = _stepper(20)
    asked = []
    loss = preempted.step(stop=lambda: asked.append(1) or True)  # stop after the first chunk
    assert asked == [1]
    first = next(iter(BufferBatches(spot_workers.build_buffer(0), 64, packing=True))).row_chunks(20)[0]
    reference = _stepper(4096)
    reference.batches = iter([first])  # one whole step on that chunk alone
    assert loss == pytest.approx(reference.step(), rel=1e-5)
    torch.testing.assert_close(spot_workers.flat(preempted.head), spot_workers.flat(reference.head))

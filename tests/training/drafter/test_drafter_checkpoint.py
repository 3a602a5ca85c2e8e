"""Async drafter checkpoints: a snapshot taken when save() returns, written atomically in the background from
start() / wait(), only the trainable head and its optimizer state; a failed write keeps the previous checkpoint
and is reported."""

import pytest
import torch

from tests.tiny_model import random_target
from tests.training import spot_workers
from tlt.drafters import load_drafter
from tlt.drafters.eagle import EagleDrafter
from tlt.training.drafter import checkpoint as drafter_checkpoint
from tlt.training.drafter.checkpoint import AsyncDrafterCheckpoint, load_drafter_checkpoint


@pytest.fixture()
def trained():
    """A drafter and an AdamW optimizer with state (one step taken)."""
    drafter = EagleDrafter.from_target(random_target(), seed=1)
    optimizer = torch.optim.AdamW(drafter.head.parameters(), lr=1e-3)
    drafter.head(
        torch.zeros(1, 3, dtype=torch.long), torch.randn(1, 3, 128), torch.arange(3)[None], None
    ).sum().backward()
    optimizer.step()
    return drafter, optimizer


def test_round_trip_with_optimizer_state_step_and_version(trained, tmp_path):
    drafter, optimizer = trained
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(drafter, optimizer, step=7, version=7)
    checkpoint.wait()
    back, state = load_drafter_checkpoint(tmp_path / "latest")
    assert (state["step"], state["version"]) == (7, 7)
    for name, tensor in drafter.head.state_dict().items():
        assert torch.equal(back.head.state_dict()[name], tensor)
    restored = torch.optim.AdamW(back.head.parameters(), lr=1e-3)
    restored.load_state_dict(state["optimizer"])
    exp_avg = [s["exp_avg"] for s in restored.state_dict()["state"].values()]
    assert len(exp_avg) == len(list(drafter.head.parameters())) and any(bool(t.any()) for t in exp_avg)
    assert isinstance(load_drafter(tmp_path / "latest"), EagleDrafter)  # a plain drafter folder too


def test_a_damaged_drafter_checkpoint_names_the_file(trained, tmp_path):
    from tlt.files import DamagedFileError

    drafter, optimizer = trained
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(drafter, optimizer, step=7, version=7)
    checkpoint.wait()
    state = tmp_path / "latest" / drafter_checkpoint.STATE_FILE
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(DamagedFileError, match=r"latest/drafter_state.pt: torch.load cannot read it"):
        load_drafter_checkpoint(tmp_path / "latest")
    weights = tmp_path / "latest" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(DamagedFileError, match=r"latest/model.safetensors: not a readable safetensors file"):
        load_drafter(tmp_path / "latest")


def test_a_drafter_steppers_warm_up_resumes_from_its_checkpoint(tmp_path):
    cfg = spot_workers.DrafterConfig(lr=1e-3, batch_tokens=64, online_warmup_steps=4)
    stepper = spot_workers.DrafterStepper(spot_workers.build_head(), spot_workers.build_buffer(0), cfg)
    spot_workers.step_lrs(stepper, 2)
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(EagleDrafter(stepper.head), stepper.optimizer, step=1, version=1)
    checkpoint.wait()
    _, state = load_drafter_checkpoint(tmp_path / "latest")
    # a fresh head: the learning rate depends on the optimizer's state alone
    resumed = spot_workers.DrafterStepper(spot_workers.build_head(), spot_workers.build_buffer(0), cfg)
    resumed.optimizer.load_state_dict(state["optimizer"])
    lrs = spot_workers.step_lrs(resumed, 4)
    assert lrs == spot_workers.step_lrs(stepper, 4) and lrs == pytest.approx([7.5e-4, 1e-3, 1e-3, 1e-3])


def test_the_snapshot_is_taken_when_save_returns(trained, tmp_path):
    drafter, optimizer = trained
    before = drafter.head.fc.weight.clone()
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(drafter, optimizer, step=1, version=1)
    with torch.no_grad():
        drafter.head.fc.weight.add_(1.0)  # training goes on while the write is in flight
    checkpoint.wait()
    back, _ = load_drafter_checkpoint(tmp_path / "latest")
    assert torch.equal(back.head.fc.weight, before)


def test_a_snapshot_is_written_only_from_start_or_wait(trained, tmp_path):
    drafter, optimizer = trained
    before = drafter.head.fc.weight.clone()
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(drafter, optimizer, step=1, version=1)
    with torch.no_grad():
        drafter.head.fc.weight.add_(1.0)
    assert not (tmp_path / "latest").exists()  # not started: nothing written yet
    checkpoint.start()
    checkpoint.wait()
    back, state = load_drafter_checkpoint(tmp_path / "latest")
    assert torch.equal(back.head.fc.weight, before) and state["step"] == 1
    checkpoint.save(drafter, optimizer, step=2, version=2)
    checkpoint.wait()  # wait() writes a snapshot not started too (the trainer's close())
    assert load_drafter_checkpoint(tmp_path / "latest")[1]["step"] == 2


def test_only_the_trainable_head_is_saved(trained, tmp_path):
    from safetensors.torch import load_file

    drafter, optimizer = trained
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(drafter, optimizer, step=1, version=1)
    checkpoint.wait()
    names = set(load_file(tmp_path / "latest" / "model.safetensors"))
    assert names == set(drafter.head.state_dict()) and not any("embed" in n or "lm_head" in n for n in names)


def test_failed_write_keeps_the_previous_checkpoint_and_is_reported(trained, tmp_path, monkeypatch):
    drafter, optimizer = trained
    checkpoint = AsyncDrafterCheckpoint(tmp_path / "latest")
    checkpoint.save(drafter, optimizer, step=1, version=1)
    checkpoint.wait()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(drafter_checkpoint.torch, "save", broken)
    checkpoint.save(drafter, optimizer, step=2, version=2)
    with pytest.raises(RuntimeError, match="disk full"):
        checkpoint.wait()
    monkeypatch.undo()
    _, state = load_drafter_checkpoint(tmp_path / "latest")
    assert state["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no half-written folder left behind

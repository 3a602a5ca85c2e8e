"""Checkpoints of a `tlt train` run: everything the next RL step depends on, written all or nothing.

    <output_dir>/checkpoint/
        policy/        HF folder, model + tokenizer (`tlt evaluate` reads it as is)
        drafter/       `drafter.save` (absent with speculative.enabled=false)
        trainer.pt     `RLTrainer.state_dict()` (optimizers, minibatch generator, problem sampler, tuner,
                       drafter buffer, KL reference) and the global RNG states (python, torch, CUDA)
        metrics.json   the `StepMetrics` of every step so far
        config.yaml    the run config it was written under
        meta.json      step and version (and world_size, from a multi-process run); written last, so a folder
                       without it is not a checkpoint

A multi-process run (`tlt.training.distributed.data_parallel`) writes the same folder from rank 0. What every rank holds
alike (policy, its optimizer, minibatch generator, problem sampler, KL reference, drafter) is saved once;
trainer.pt then holds, under "ranks", each rank's own parts (tuner, drafter buffer, drafter optimizer) and
RNG states, and every rank resumes from its entry. Such a checkpoint resumes only with the same number of
processes.

A checkpoint is built in a temporary sibling folder; then the previous one is renamed to `checkpoint.old`,
the new one to `checkpoint`, and only then is the old one deleted. A crash at any point leaves a complete
checkpoint: `checkpoint`, or `checkpoint.old` if the crash fell between the two renames (`find_checkpoint`
falls back to it).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from tlt.config import ConfigError, RunConfig, load_config, to_yaml
from tlt.files import atomic_folder, read_json, read_torch
from tlt.models.io import load_hf_folder, save_hf_folder
from tlt.training.rl_loop import RewardFn, RLTrainer

CHECKPOINT = "checkpoint"
META = "meta.json"
# Keys a resumed run may change: how long it runs and its bookkeeping, nothing the RL step reads.
RESUMABLE_CHANGES = ("output_dir", "grpo.steps", "train.")


def find_checkpoint(output_dir: str | Path) -> Path | None:
    """The run's complete checkpoint folder, or None."""
    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):
        folder = Path(output_dir) / name
        if (folder / META).is_file():
            return folder
    return None


def rng_state() -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"python": random.getstate(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


RANK_LOCAL = ("tuner", "buffer", "drafter_optimizer")  # trainer-state keys each rank of a run has its own of


def save_checkpoint(
    output_dir: str | Path,
    trainer: RLTrainer,
    metrics: list[dict],
    ranks: list[dict] | None = None,
    state: dict | None = None,
) -> Path:
    """Write the trainer's whole state after its last step into `<output_dir>/checkpoint` (see module doc).

    ranks: from a multi-process run, per rank {"trainer": its RANK_LOCAL state, "rng": its `rng_state()`};
    state: `trainer.state_dict()` when the caller already has it (a collective one, under FSDP).
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f".{CHECKPOINT}.tmp.*"):  # left by a crash during an earlier save
        shutil.rmtree(stale, ignore_errors=True)
    with atomic_folder(out / CHECKPOINT) as tmp:
        save_hf_folder(trainer.policy, trainer.tokenizer, tmp / "policy")
        if trainer.drafter is not None:
            trainer.drafter.save(tmp / "drafter")
        payload = {"trainer": trainer.state_dict() if state is None else state, "rng": rng_state()}
        if ranks is not None:
            payload["trainer"] = {k: v for k, v in payload["trainer"].items() if k not in RANK_LOCAL}
            payload["ranks"] = ranks
        torch.save(payload, tmp / "trainer.pt")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        (tmp / "config.yaml").write_text(to_yaml(trainer.cfg))
        meta = {"step": trainer.step_index, "version": trainer.version}
        if ranks is not None:
            meta["world_size"] = len(ranks)
        (tmp / META).write_text(json.dumps(meta) + "\n")
    return out / CHECKPOINT


def config_changes(saved: RunConfig, cfg: RunConfig) -> list[str]:
    """Dotted keys whose values differ between the checkpoint's config and `cfg`, except RESUMABLE_CHANGES."""
    a, b = _flat(dataclasses.asdict(saved)), _flat(dataclasses.asdict(cfg))
    return [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k) and not k.startswith(RESUMABLE_CHANGES)]


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def checkpoint_world_size(folder: Path) -> int:
    """How many processes wrote the checkpoint in `folder` (1 for a single-process run)."""
    meta = read_json(folder / META)
    if not isinstance(meta, dict):
        raise ValueError(f"{folder / META}: expected a JSON object with the step, got {meta!r}")
    return meta.get("world_size", 1)


def check_world_size(folder: Path, world_size: int) -> None:
    """Raise ConfigError unless the checkpoint in `folder` was written by `world_size` processes."""
    saved = checkpoint_world_size(folder)
    if saved != world_size:
        raise ConfigError(
            f"train.devices: {folder} was written by a run of {saved} process(es), this run has "
            f"{world_size}; resume it with train.devices={saved} (or under torchrun with {saved} processes), "
            "or pick a new output_dir"
        )


def load_checkpoint(
    folder: Path,
    cfg: RunConfig,
    problems,
    reward_fn: RewardFn,
    device: torch.device,
    make_trainer=RLTrainer,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[RLTrainer, list[dict]]:
    """(the trainer exactly as it was after the checkpoint's last step, the metrics of its steps so far).

    make_trainer: `RLTrainer` or a callable with its signature (a multi-process trainer); rank and
    world_size: this process in a multi-process run, which restores its own entry of "ranks".
    Global RNG states are restored last, after building the trainer (building moves torch's RNG).
    A file that cannot be read is a CheckpointError naming it; nothing in the folder is changed.
    """
    files = _read_files(folder, cfg, world_size)
    policy, tokenizer = files["policy"]
    trainer = make_trainer(cfg, policy, tokenizer, problems, files["drafter"], reward_fn, device)
    with _reading(folder):
        state = files["trainer.pt"]
        trainer_state, rng = state["trainer"], state["rng"]
        if "ranks" in state:
            own = state["ranks"][rank]
            trainer_state, rng = trainer_state | own["trainer"], own["rng"]
        trainer.load_state_dict(trainer_state)
        set_rng_state(rng)
    return trainer, files["metrics.json"]


def _read_files(folder: Path, cfg: RunConfig, world_size: int, check: bool = False) -> dict:
    """The checkpoint's files by name, read (`check`: checked to be readable, without loading the weights: the
    policy's and the drafter's files checked, trainer.pt mapped), after its world size is checked. The one list
    of what a resume reads, for `load_checkpoint` and `check_checkpoint` alike."""
    from tlt.drafters import check_drafter_folder, load_drafter
    from tlt.models.io import check_hf_folder

    with _reading(folder):
        check_world_size(folder, world_size)
        drafter = None
        if cfg.speculative.enabled:
            drafter = (check_drafter_folder if check else load_drafter)(folder / "drafter")
        return {
            "policy": (check_hf_folder if check else load_hf_folder)(folder / "policy"),
            "drafter": drafter,
            "trainer.pt": read_torch(folder / "trainer.pt", weights_only=True, mmap=check),
            "metrics.json": read_json(folder / "metrics.json"),
        }


def check_checkpoint(folder: Path, cfg: RunConfig, world_size: int) -> None:
    """Raise CheckpointError (or ConfigError) unless `load_checkpoint` can read the run's files in `folder`: the
    check a parent process runs before it spawns ranks, so a damaged file is one error, not one per rank. No
    weights are loaded: the trainer state is mapped, the policy's and drafter's files are checked."""
    _read_files(folder, cfg, world_size, check=True)


class CheckpointError(ConfigError):
    """A checkpoint whose files cannot be read (changed or damaged after it was written); names the folder and
    the error, and what to do."""


@contextmanager
def _reading(folder: Path) -> Iterator[None]:
    """Errors reading `folder`'s files as CheckpointError (a one-line `tlt train` error); a ConfigError (this
    run may not resume it) as it is."""
    try:
        yield
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, IndexError, RuntimeError) as e:  # read_torch names unpickling errors
        raise CheckpointError(
            f"cannot resume from {folder}: {e}; restore that file, or move the folder away to start the run "
            "over (or pick a new output_dir)"
        ) from e


def saved_config(folder: Path) -> RunConfig:
    return load_config(folder / "config.yaml")

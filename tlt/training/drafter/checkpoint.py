"""Selective, asynchronous drafter checkpoints (TLT saves only the trainable drafter, in the background: 893 ms ->
97 ms, so spot training stays cheap to preempt).

Only the EAGLE head's own tensors and its optimizer state are saved, never the target's embedding or LM head.
The caller's thread only copies them to CPU (`save` takes that snapshot and returns the seconds it blocked);
`start()` then writes the folder in a background thread, atomically (`tlt.drafters.save_folder`: a reader sees
the previous checkpoint or the new one, never half of one), and `wait()` blocks until it is on disk (starting a
write not started yet). One write is in flight at a time: `save` first waits for the previous one. The trainer
snapshots at a step's end and starts the write once the next step's rollout is over, so it never shares a core
with a rank that is still decoding (started at the step's end, it slowed the next rollout's first forward by
8-14 ms on a 2-core VM: eval/results/spot_overhead_quickstart_ckpt.md).

The folder is a saved EAGLE drafter (`tlt.drafters.load_drafter` reads it, `tlt export-drafter` exports it)
plus `drafter_state.pt` (optimizer state, RL step, policy version), so drafter training resumes from it:
`load_drafter_checkpoint`, or `drafter.path=<folder>` in a run config (the trainer then restores the
optimizer state too).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import torch

from tlt.drafters import save_folder
from tlt.drafters.eagle import WEIGHTS_FILE, EagleDrafter
from tlt.files import read_torch

STATE_FILE = "drafter_state.pt"


class AsyncDrafterCheckpoint:
    """Writes `drafter` checkpoints to `path` in a background thread (module doc)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._thread: threading.Thread | None = None
        self._pending: tuple | None = None  # a snapshot whose write has not started
        self._error: BaseException | None = None

    def save(self, drafter: EagleDrafter, optimizer: torch.optim.Optimizer | None, step: int, version: int) -> float:
        """Snapshot the head (and optimizer state) to CPU now, to be written by the next `start()` / `wait()`;
        returns the seconds the caller was blocked (the wait for a previous write included)."""
        began = time.perf_counter()
        self.wait()
        weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in drafter.head.state_dict().items()}
        state = {
            "optimizer": None if optimizer is None else _cpu_copy(optimizer.state_dict()),
            "step": step,
            "version": version,
        }
        meta = {"kind": drafter.kind, **dataclasses.asdict(drafter.config)}
        self._pending = (weights, state, meta)
        return time.perf_counter() - began

    def start(self) -> None:
        """Start writing the snapshot taken by `save`, if its write has not started, in the background."""
        if self._pending is not None:
            self._thread = threading.Thread(target=self._write, args=self._pending, daemon=False)
            self._pending = None
            self._thread.start()

    def wait(self) -> None:
        """Block until the last snapshot is on disk (starting its write if not started); re-raise its error,
        if any."""
        self.start()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"asynchronous drafter checkpoint to {self.path} failed: {error}") from error

    def _write(self, weights: dict, state: dict, meta: dict) -> None:
        from safetensors.torch import save_file

        def fill(tmp: Path) -> None:
            save_file(weights, str(tmp / WEIGHTS_FILE))
            torch.save(state, tmp / STATE_FILE)

        try:
            save_folder(self.path, fill, meta)
        except BaseException as err:  # reported by the next wait() / save()
            self._error = err


def load_drafter_checkpoint(path: str | Path) -> tuple[EagleDrafter, dict | None]:
    """(drafter, state) of a drafter folder (`load_drafter_state`)."""
    return EagleDrafter.load(path), load_drafter_state(path)


def load_drafter_state(path: str | Path) -> dict | None:
    """The training state ({"optimizer", "step", "version"}) saved with a drafter folder; None for a drafter
    saved without one (e.g. by `tlt train-drafter`)."""
    file = Path(path) / STATE_FILE
    return read_torch(file, weights_only=False) if file.is_file() else None


def check_drafter_state(path: str | Path) -> None:
    """Raise DamagedFileError unless the training state saved with a drafter folder, if any, reads (mapped: no
    tensor is loaded)."""
    file = Path(path) / STATE_FILE
    if file.is_file():
        read_torch(file, weights_only=False, mmap=True)


def _cpu_copy(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _cpu_copy(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_cpu_copy(v) for v in tree)
    return tree

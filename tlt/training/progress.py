"""Plain progress lines for long Lightning fits (a progress bar does not show in logs or CI output)."""

from __future__ import annotations

import time

import lightning as L


class ProgressLines(L.Callback):
    """`[tlt] <label> step k/total  loss x  r steps/s  ETA s` every `every` optimizer steps, on rank 0."""

    def __init__(self, label: str, every: int):
        self.label, self.every, self.start, self.first = label, every, 0.0, 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start, self.first = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, total = trainer.global_step, trainer.max_steps
        if trainer.is_global_zero and (step % self.every == 0 or step == total):
            rate = (step - self.first) / max(time.perf_counter() - self.start, 1e-9)
            eta = (total - step) / max(rate, 1e-9)
            loss = float(outputs["loss"]) if isinstance(outputs, dict) else float(outputs)
            print(
                f"[tlt] {self.label} step {step}/{total}  loss {loss:.3f}  {rate:.1f} steps/s  ETA {eta:.0f}s",
                flush=True,
            )

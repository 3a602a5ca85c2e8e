"""Training the EAGLE head: one LightningModule and one data path for offline distillation and online use.

Each step draws about `batch_tokens` real tokens of samples from a `DrafterBuffer` (recency-weighted) and
lays them out packed (first-fit rows as long as the longest sample, per-document attention) or padded (one
sample per row, the unpacked baseline). The target's
embedding and LM head are shared buffers of the head, never parameters, so they are neither trained nor
saved.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from tlt.config import DrafterConfig
from tlt.drafters.eagle_head import EagleHead
from tlt.machine import resolve_precision
from tlt.training.drafter.buffer import DrafterBuffer
from tlt.training.drafter.loss import DrafterLossOutput, EagleLoss
from tlt.training.drafter.packing import PackedBatch, pack, pad
from tlt.training.progress import ProgressLines


class BufferBatches(IterableDataset):
    """Endless batches of about `batch_tokens` real tokens sampled from a buffer, packed or padded."""

    def __init__(self, buffer: DrafterBuffer, batch_tokens: int, packing: bool):
        self.buffer, self.batch_tokens, self.packing = buffer, batch_tokens, packing

    def __iter__(self) -> Iterator[PackedBatch]:
        while True:
            samples = self.buffer.sample(self.batch_tokens)
            yield pack(samples) if self.packing else pad(samples)


class DrafterModule(L.LightningModule):
    """Thin LightningModule: EAGLE loss on the head's training forward, AdamW with warmup + cosine decay."""

    def __init__(self, head: EagleHead, cfg: DrafterConfig, max_steps: int):
        super().__init__()
        self.head, self.cfg, self.max_steps = head, cfg, max_steps
        self.loss = EagleLoss(cfg.w_feature, cfg.w_token)
        self.last: dict[str, float] = {}

    def batch_loss(self, batch: PackedBatch) -> DrafterLossOutput:
        """EAGLE loss averaged over the batch's trained pairs (response tokens, within one document); under
        bf16 autocast with drafter.precision=bf16-mixed (the softmaxes still run in float32)."""
        p = batch.pairs()
        dtype = self.head.fc.weight.dtype
        device = self.head.fc.weight.device.type
        bf16 = resolve_precision(self.cfg.precision, device) == "bf16-mixed"
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            pred = self.head.train_forward(p.tokens, p.hidden, p.position_ids, p.document_ids)  # [B, L - 1, D]
            return self.loss(pred, p.target.to(dtype), self.head.lm_head, p.loss_mask)

    def training_step(self, batch: PackedBatch, batch_idx: int) -> torch.Tensor:
        out = self.batch_loss(batch)
        self.log_dict({"loss": out.loss, "top1": out.top1}, prog_bar=True, batch_size=batch.tokens.shape[0])
        self.last = {"loss": out.loss.item(), "top1": out.top1.item()}
        return out.loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.head.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        warmup = max(1, self.max_steps // 20)

        def scale(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, self.max_steps - warmup))
            return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, scale)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit_drafter(
    head: EagleHead, buffer: DrafterBuffer, cfg: DrafterConfig, max_steps: int, progress: bool = True
) -> dict[str, float]:
    """max_steps optimizer steps on batches from `buffer`; returns the last batch's loss and top-1 agreement.

    The head is left in eval mode. Randomness: the buffer's generator (data) and torch's global RNG (none
    used by the head, which has no dropout).
    """
    loader = DataLoader(BufferBatches(buffer, cfg.batch_tokens, cfg.packing), batch_size=None)
    module = DrafterModule(head.train(), cfg, max_steps)
    device = head.fc.weight.device
    trainer = L.Trainer(
        accelerator=device.type,
        devices=[device.index or 0] if device.type == "cuda" else 1,
        max_steps=max_steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[ProgressLines("drafter", every=max(1, max_steps // 10))] if progress else [],
        gradient_clip_val=1.0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=loader)
    head.eval()
    return module.last

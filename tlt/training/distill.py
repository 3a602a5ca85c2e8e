"""Offline distillation of an EAGLE head on the target's own generations (`tlt train-drafter`).

The target generates responses to training prompts with the native engine (greedy or sampled), returning the
final-norm hidden state of every response position; the prompt positions' states come from one HF forward.
Each sequence x_0..x_{L-1} with features h_0..h_{L-2} gives training pairs (h_i, x_{i+1}) -> h_{i+1}; the loss
(EAGLE-1, `tlt.training.drafter_loss`) is taken where x_{i+1} is a response token, as TLT trains on responses.
Acceptance is measured before and after training on held-out prompts: mean tokens per SD step and row
(accepted drafts + the bonus token), the EAGLE "acceptance length".
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.config import DrafterConfig
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.eagle_head import EagleHead
from tlt.schedulers.tuners import FixedTuner
from tlt.speculative.strategy import SpecStrategy
from tlt.training.drafter_loss import EagleLoss


@dataclass
class DrafterSequence:
    """One prompt + response with the target's features, the unit of drafter training data."""

    tokens: torch.Tensor  # [L] int64 prompt + response
    hidden: torch.Tensor  # [L - 1, D] h_i of tokens[i] (the last token's feature is never computed)
    num_prompt: int  # P


@dataclass
class DistillReport:
    sequences: int
    train_pairs: int  # pairs with loss
    steps: int
    strategy: str
    accept_before: float  # acceptance length (tokens per SD step and row) of the starting head
    accept_after: float
    final_loss: float
    final_top1: float  # share of pairs whose top-1 token the head predicts right (last logged batch)
    seconds: float


@torch.inference_mode()
def collect_sequences(
    model, prompts: list[list[int]], sampling: SamplingParams, eos_token_id: int | None, batch_size: int = 64
) -> list[DrafterSequence]:
    """Generate one response per prompt with the target and attach its final-norm features."""
    max_seq_len = min(max(map(len, prompts)) + sampling.max_new_tokens, model.config.max_position_embeddings)
    engine = NativeEngine(model, eos_token_id, max_seq_len, return_hidden=True, truncate_prompts="left")
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        rollouts = engine.generate(chunk, sampling)
        padded = torch.nn.utils.rnn.pad_sequence([r.prompt_ids for r in rollouts], batch_first=True)  # [B, T]
        prompt_hidden = model.model(
            input_ids=padded
        ).last_hidden_state  # [B, T, D], causal: padding is harmless
        for b, r in enumerate(rollouts):
            P = r.prompt_ids.numel()
            hidden = torch.cat([prompt_hidden[b, : P - 1], r.hidden_states], dim=0)  # [P - 1 + R, D]
            if r.token_ids.numel() >= 2:  # at least one pair with a response token and a known target
                out.append(DrafterSequence(torch.cat([r.prompt_ids, r.token_ids]), hidden.float(), P))
    return out


def collate_pairs(batch: list[DrafterSequence]) -> dict[str, torch.Tensor]:
    """Right-padded pairs: tokens x_{i+1} [B, T], hidden h_i and target h_{i+1} [B, T, D], mask [B, T]."""
    T = max(s.tokens.numel() - 2 for s in batch)
    D = batch[0].hidden.shape[1]
    tokens = torch.zeros(len(batch), T, dtype=torch.long)
    hidden, target = torch.zeros(len(batch), T, D), torch.zeros(len(batch), T, D)
    mask = torch.zeros(len(batch), T, dtype=torch.bool)
    for b, s in enumerate(batch):
        n = s.tokens.numel() - 2
        tokens[b, :n] = s.tokens[1 : n + 1]
        hidden[b, :n], target[b, :n] = s.hidden[:n], s.hidden[1 : n + 1]
        mask[b, :n] = torch.arange(1, n + 1) >= s.num_prompt  # x_{i+1} is a response token
    return {"tokens": tokens, "hidden": hidden, "target": target, "mask": mask}


def token_batches(lengths: list[int], batch_tokens: int, seed: int) -> list[list[int]]:
    """Shuffled batches of similar lengths, at most batch_tokens padded tokens each (a longer one alone)."""
    rng = random.Random(seed)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    rng.shuffle(batches)
    return batches


class DrafterModule(L.LightningModule):
    """Thin LightningModule: EAGLE loss on the head's training forward, AdamW with warmup + cosine decay."""

    def __init__(self, head: EagleHead, cfg: DrafterConfig, max_steps: int):
        super().__init__()
        self.head, self.cfg, self.max_steps = head, cfg, max_steps
        self.loss = EagleLoss(cfg.w_feature, cfg.w_token)
        self.last: dict[str, float] = {}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        pred = self.head.train_forward(batch["tokens"], batch["hidden"])  # [B, T, D]
        out = self.loss(pred, batch["target"], self.head.lm_head, batch["mask"])
        self.log_dict(
            {"loss": out.loss, "top1": out.top1}, prog_bar=True, batch_size=batch["tokens"].shape[0]
        )
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


def train_head(
    drafter: EagleDrafter, data: list[DrafterSequence], cfg: DrafterConfig, seed: int, progress: bool = True
) -> dict[str, float]:
    """cfg.train_steps optimizer steps on `data`; returns the last batch's loss and top-1 agreement."""
    lengths = [s.tokens.numel() - 2 for s in data]
    epochs = -(-cfg.train_steps // len(token_batches(lengths, cfg.batch_tokens, seed)))
    batches = [b for e in range(epochs) for b in token_batches(lengths, cfg.batch_tokens, seed + e)]
    loader = DataLoader(data, batch_sampler=batches, collate_fn=collate_pairs)
    module = DrafterModule(drafter.head.train(), cfg, cfg.train_steps)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=cfg.train_steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        gradient_clip_val=1.0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=loader)
    drafter.head.eval()
    return module.last


def acceptance_length(
    model,
    drafter: EagleDrafter,
    prompts: list[list[int]],
    strategy: SpecStrategy | str,
    max_new_tokens: int,
    eos_token_id: int | None,
) -> float:
    """Greedy SD on every step; mean tokens per SD step and row (accepted drafts + 1 bonus token)."""
    max_seq_len = min(max(map(len, prompts)) + max_new_tokens, model.config.max_position_embeddings)
    tuner = FixedTuner(strategy, threshold=len(prompts))
    engine = NativeEngine(
        model, eos_token_id, max_seq_len, tuner=tuner, drafter=drafter, truncate_prompts="left"
    )
    engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new_tokens))
    sd = [s for s in engine.step_stats if s.sd_on]
    rows = sum(s.running_batch for s in sd)
    return (sum(s.accepted_tokens for s in sd) + rows) / max(rows, 1)


def distill_drafter(
    model,
    train_prompts: list[list[int]],
    heldout_prompts: list[list[int]],
    cfg: DrafterConfig,
    eos_token_id: int | None,
    out: str | Path | None,
    seed: int = 0,
    progress: bool = True,
) -> tuple[EagleDrafter, DistillReport]:
    """Distil an EAGLE head for `model` (an HF Qwen2 / Llama causal LM) and save it to `out` (atomically).

    Starts from the saved drafter at cfg.path when given, else from an untrained head seeded by `seed`.
    """
    start = time.perf_counter()
    drafter = EagleDrafter.load(cfg.path) if cfg.path else EagleDrafter.from_target(model, seed)
    drafter.bind(model)

    def measure() -> float:
        return acceptance_length(
            model, drafter, heldout_prompts, cfg.eval_strategy, cfg.distill_max_new_tokens, eos_token_id
        )

    before = measure()
    where = f"{cfg.eval_strategy}, {len(heldout_prompts)} held-out prompts"
    _say(progress, f"acceptance length before training: {before:.3f} ({where})")
    sampling = SamplingParams(cfg.distill_temperature, max_new_tokens=cfg.distill_max_new_tokens, seed=seed)
    data = collect_sequences(model, train_prompts, sampling, eos_token_id)
    pairs = sum(s.tokens.numel() - 1 - max(1, s.num_prompt) for s in data)
    _say(progress, f"{len(data)} sequences, {pairs} response pairs; training {cfg.train_steps} steps")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        last = train_head(drafter, data, cfg, seed, progress)
    after = measure()
    _say(progress, f"acceptance length after training: {after:.3f} (before {before:.3f})")
    if out is not None:
        drafter.save(out)
    seconds = time.perf_counter() - start
    report = DistillReport(
        len(data),
        pairs,
        cfg.train_steps,
        cfg.eval_strategy,
        before,
        after,
        last["loss"],
        last["top1"],
        seconds,
    )
    return drafter, report


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(f"[tlt] {text}", flush=True)


def run_train_drafter(cfg, model_path: str | Path, out: str | Path, progress: bool = True) -> DistillReport:
    """`tlt train-drafter`: distil an EAGLE head for the HF folder `model_path` into `out` (RunConfig cfg)."""
    from tlt.config import ConfigError
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix, training_problems
    from tlt.models.io import load_hf_folder

    d = cfg.drafter
    if d.kind != "eagle":
        raise ConfigError(f"drafter.kind: got {d.kind!r}; train-drafter distils 'eagle' drafters only")
    model, tokenizer = load_hf_folder(model_path)
    mix = task_mix(cfg.data)

    def encode(problems) -> list[list[int]]:
        return [tokenizer.encode(format_prompt(p.question)) for p in problems]

    train = encode(training_problems(mix, d.distill_prompts, cfg.data.seed))
    heldout = encode(heldout_problems(mix, d.eval_prompts, cfg.data.seed))
    _, report = distill_drafter(model, train, heldout, d, tokenizer.eos_token_id, out, cfg.seed, progress)
    return report

"""Offline distillation of a drafter on the target's own generations (`tlt train-drafter`).

EAGLE (`distill_drafter`):

The target generates responses to training prompts with the native engine (greedy or sampled), returning the
final-norm hidden state of every response position; the prompt positions' states come from one HF forward.
Each sequence x_0..x_{T-1} with features h_0..h_{T-1} gives training pairs (h_i, x_{i+1}) -> h_{i+1}; the loss
(EAGLE-1, `tlt.training.drafter.loss`) is taken where x_{i+1} is a response token, as TLT trains on responses.
Training goes through the same buffer, packing and LightningModule as online training
(`tlt.training.drafter.module`).

Small LM (`distill_small_lm`): sequence-level knowledge distillation (Kim & Rush 2016,
https://arxiv.org/abs/1606.07947): next-token cross-entropy on the target's own responses (+ EOS when it
stopped), through the bootstrap's SFT LightningModule (AdamW, warm-up, cosine decay).

Acceptance is measured before and after training on held-out prompts: mean tokens per SD step and row
(accepted drafts + the bonus token), the EAGLE "acceptance length".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.config import DrafterConfig
from tlt.drafters.base import Drafter
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.small_lm import SmallLMDrafter
from tlt.schedulers.tuners import FixedTuner
from tlt.speculative.strategy import SpecStrategy
from tlt.training.drafter.buffer import DrafterBuffer, DrafterSample
from tlt.training.drafter.module import fit_drafter
from tlt.training.sft import SFTDataModule, SFTExample, SFTModule


@dataclass
class DistillReport:
    sequences: int
    train_pairs: int  # pairs with loss
    steps: int
    strategy: str
    accept_before: float  # acceptance length (tokens per SD step and row) of the starting head
    accept_after: float
    final_loss: float
    final_top1: float | None  # share of pairs whose top-1 token the head predicts right (last batch; EAGLE)
    seconds: float


@torch.inference_mode()
def collect_sequences(
    model,
    prompts: list[list[int]],
    sampling: SamplingParams,
    eos_token_id: int | None,
    batch_size: int = 64,
    progress: bool = False,
) -> list[DrafterSample]:
    """Generate one response per prompt with the target; samples carry its final-norm features (version 0,
    `DrafterSample.from_rollout`: prompt + response minus the last token, the response tokens trained)."""
    engine = _engine(model, prompts, sampling.max_new_tokens, eos_token_id, return_hidden=True)
    rollouts = _generate(engine, prompts, sampling, batch_size, progress)
    samples = [DrafterSample.from_rollout(r, 0) for r in rollouts]
    return [s for s in samples if s is not None]


@torch.inference_mode()
def collect_responses(
    model,
    prompts: list[list[int]],
    sampling: SamplingParams,
    eos_token_id: int | None,
    batch_size: int = 64,
    progress: bool = False,
) -> list[SFTExample]:
    """The target's response to each prompt as an SFT example: prompt + response (its EOS included)."""
    engine = _engine(model, prompts, sampling.max_new_tokens, eos_token_id)
    rollouts = _generate(engine, prompts, sampling, batch_size, progress)
    return [SFTExample(torch.cat([r.prompt_ids, r.token_ids]).cpu(), r.prompt_ids.numel()) for r in rollouts]


def _generate(
    engine: NativeEngine, prompts: list[list[int]], sampling: SamplingParams, batch_size: int, progress: bool
):
    """One rollout per prompt, generated `batch_size` prompts at a time (a progress line per batch)."""
    began = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        yield from engine.generate(prompts[start : start + batch_size], sampling)
        done = min(start + batch_size, len(prompts))
        _say(
            progress,
            f"target answers for distillation: {done}/{len(prompts)} prompts ({time.perf_counter() - began:.0f} s)",
        )


def _engine(model, prompts: list[list[int]], max_new_tokens: int, eos_token_id: int | None, **options) -> NativeEngine:
    """A native engine over `model` with room for the longest prompt and `max_new_tokens` (within the model's
    positions; longer prompts keep their last tokens)."""
    max_seq_len = min(max(map(len, prompts)) + max_new_tokens, model.config.max_position_embeddings)
    return NativeEngine(model, eos_token_id, max_seq_len, truncate_prompts="left", device=model.device, **options)


def acceptance_length(
    model,
    drafter: Drafter,
    prompts: list[list[int]],
    strategy: SpecStrategy | str,
    max_new_tokens: int,
    eos_token_id: int | None,
) -> float:
    """Greedy SD on every step; mean tokens per SD step and row (accepted drafts + 1 bonus token)."""
    tuner = FixedTuner(strategy, threshold=len(prompts))
    engine = _engine(model, prompts, max_new_tokens, eos_token_id, tuner=tuner, drafter=drafter)
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
    drafter = EagleDrafter.load(cfg.path) if cfg.path else EagleDrafter.from_target(model, seed)
    drafter.bind(model)

    def train(sampling: SamplingParams) -> _Trained:
        data = collect_sequences(model, train_prompts, sampling, eos_token_id, progress=progress)
        pairs = sum(int(s.loss_mask[1:].sum()) for s in data)
        _say(progress, f"{len(data)} sequences, {pairs} response pairs; training {cfg.train_steps} steps")
        buffer = DrafterBuffer(max_bytes=max(1, sum(s.nbytes for s in data)), seed=seed, device=model.device)
        buffer.add(data)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            last = fit_drafter(drafter.head, buffer, cfg, cfg.train_steps, progress)
        return _Trained(len(data), pairs, last["loss"], last["top1"])

    return drafter, _measured(model, drafter, heldout_prompts, cfg, eos_token_id, out, seed, progress, train)


def distill_small_lm(
    model,
    train_prompts: list[list[int]],
    heldout_prompts: list[list[int]],
    cfg: DrafterConfig,
    eos_token_id: int | None,
    out: str | Path | None,
    seed: int = 0,
    progress: bool = True,
    batch_size: int = 16,
) -> tuple[SmallLMDrafter, DistillReport]:
    """Distil a small LM drafter (preset cfg.small_lm_preset, or the saved one at cfg.path) for `model`."""
    if cfg.path:
        drafter = SmallLMDrafter.load(cfg.path)
    else:
        drafter = SmallLMDrafter.from_preset(cfg.small_lm_preset, model.config.vocab_size, seed)
    drafter.bind(model)

    def train(sampling: SamplingParams) -> _Trained:
        examples = collect_responses(model, train_prompts, sampling, eos_token_id, progress=progress)
        tokens = sum(e.input_ids.numel() - e.num_prompt for e in examples)
        _say(progress, f"{len(examples)} sequences, {tokens} response tokens; training {cfg.train_steps} steps")
        epochs = -(-cfg.train_steps * batch_size // max(1, len(examples)))  # enough passes for train_steps
        data = SFTDataModule(examples, batch_size, pad_id=0, seed=seed, epochs=epochs)
        module = SFTModule(drafter.model.train(), cfg.lr, max(1, cfg.train_steps // 20), cfg.train_steps, 0.0)
        trainer = L.Trainer(
            accelerator="cpu" if drafter.device.type == "cpu" else drafter.device.type,
            devices=1,
            max_steps=cfg.train_steps,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=progress,
            gradient_clip_val=1.0,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            trainer.fit(module, datamodule=data)
        drafter.model.eval()
        return _Trained(len(examples), tokens, float(trainer.callback_metrics.get("loss", float("nan"))), None)

    return drafter, _measured(model, drafter, heldout_prompts, cfg, eos_token_id, out, seed, progress, train)


@dataclass
class _Trained:
    """What a distiller's training part reports: data size, last loss, top-1 agreement (EAGLE only)."""

    sequences: int
    train_pairs: int
    loss: float
    top1: float | None


def _measured(
    model,
    drafter: Drafter,
    heldout_prompts: list[list[int]],
    cfg: DrafterConfig,
    eos_token_id: int | None,
    out: str | Path | None,
    seed: int,
    progress: bool,
    train: Callable[[SamplingParams], _Trained],
) -> DistillReport:
    """Held-out acceptance length before and after `train` (given the distillation sampling), then the save."""
    start = time.perf_counter()

    def measure() -> float:
        return acceptance_length(
            model, drafter, heldout_prompts, cfg.eval_strategy, cfg.distill_max_new_tokens, eos_token_id
        )

    before = measure()
    where = f"{cfg.eval_strategy}, {len(heldout_prompts)} held-out prompts"
    _say(progress, f"acceptance length before training: {before:.3f} ({where})")
    trained = train(SamplingParams(cfg.distill_temperature, max_new_tokens=cfg.distill_max_new_tokens, seed=seed))
    after = measure()
    _say(progress, f"acceptance length after training: {after:.3f} (before {before:.3f})")
    if out is not None:
        drafter.save(out)
    return DistillReport(
        trained.sequences,
        trained.train_pairs,
        cfg.train_steps,
        cfg.eval_strategy,
        before,
        after,
        trained.loss,
        trained.top1,
        time.perf_counter() - start,
    )


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(f"[tlt] {text}", flush=True)


def run_train_drafter(cfg, model_path: str | Path, out: str | Path, progress: bool = True) -> DistillReport:
    """`tlt train-drafter`: distil a cfg.drafter.kind drafter for the HF folder `model_path` into `out`, on
    `train.device` (auto: CUDA when available). Prompts: `distillation_prompts`."""
    from tlt.config import ConfigError
    from tlt.data.prompts import format_prompt
    from tlt.models.io import load_hf_folder
    from tlt.training.train import check_data_paths, resolve_device

    d = cfg.drafter
    if d.kind not in DISTILLERS:
        raise ConfigError(f"drafter.kind: got {d.kind!r}; train-drafter distils {' or '.join(DISTILLERS)} drafters")
    check_data_paths(cfg)
    device = resolve_device(cfg.train.device)
    model, tokenizer = load_hf_folder(model_path)
    model.to(device)

    def encode(problems) -> list[list[int]]:
        return [tokenizer.encode(format_prompt(p.question)) for p in problems]

    train, heldout = (encode(problems) for problems in distillation_prompts(cfg))
    distill = DISTILLERS[d.kind]
    _, report = distill(model, train, heldout, d, tokenizer.eos_token_id, out, cfg.seed, progress)
    return report


def distillation_prompts(cfg) -> tuple[list, list]:
    """(training, held-out) problems of `tlt train-drafter`: `drafter.distill_prompts` and
    `drafter.eval_prompts` of the generated mix's training and held-out sets; with `data.jsonl`, of the files'
    problems (those `tlt train` rolls out), seeded-shuffled, the held-out ones first and disjoint from the rest."""
    import random

    from tlt.data.splits import heldout_problems, rl_problems, task_mix, training_problems

    d, seed = cfg.drafter, cfg.data.seed
    if not cfg.data.jsonl:
        mix = task_mix(cfg.data)
        return training_problems(mix, d.distill_prompts, seed), heldout_problems(mix, d.eval_prompts, seed)
    problems = rl_problems(cfg.data)
    random.Random(seed).shuffle(problems)
    heldout = problems[: min(d.eval_prompts, len(problems) // 2)]
    return problems[len(heldout) :][: d.distill_prompts], heldout


DISTILLERS = {"eagle": distill_drafter, "small_lm": distill_small_lm}

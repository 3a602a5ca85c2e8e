"""`tlt bootstrap`: build a tokenizer and a tiny Qwen2 base policy, SFT it on generated step-by-step solutions.

Writes `<folder>/model` (HF folder: model + tokenizer) and `<folder>/card.json` (preset, seed, data mix,
held-out accuracy, response-length stats), where the folder is `bootstrap_folder(cfg)`: model.path's parent when
model.path is set (so the policy lands where `tlt train` looks for it), else output_dir. Resumable: Lightning
checkpoints in `<folder>/checkpoints`. Deterministic for a seed on one device.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import asdict
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoTokenizer

from tlt.config import ConfigError, RunConfig
from tlt.data.prompts import format_prompt, format_response
from tlt.data.splits import heldout_problems, task_mix, training_problems
from tlt.data.tasks import GYM_FAMILIES
from tlt.eval.heldout import evaluate
from tlt.files import atomic_write_json
from tlt.machine import resolve_precision
from tlt.models.io import save_hf_folder
from tlt.models.presets import build_model, count_parameters
from tlt.models.tokenizer import train_tokenizer
from tlt.training.progress import ProgressLines
from tlt.training.sft import SFTDataModule, SFTModule, encode_examples


def _tokenizer(cfg: RunConfig, texts: list[str], folder: Path):
    """Train the tokenizer once per run folder; reuse it on resume (the model's vocabulary depends on it)."""
    if (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    tokenizer = train_tokenizer(texts, cfg.model.vocab_size)
    tokenizer.save_pretrained(folder)
    return tokenizer


def _trainer(cfg: RunConfig, ckpt_dir: Path) -> L.Trainer:
    b = cfg.bootstrap
    return L.Trainer(
        accelerator="cpu" if not torch.cuda.is_available() else "auto",
        devices=b.devices,
        strategy="ddp" if b.devices > 1 else "auto",
        max_steps=b.max_steps,
        max_epochs=-1,
        precision=resolve_precision(b.precision, "cuda" if torch.cuda.is_available() else "cpu"),
        logger=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        deterministic=True,
        use_distributed_sampler=False,
        callbacks=[
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=b.checkpoint_every, save_last=True),
            ProgressLines("bootstrap", every=max(1, b.max_steps // 20)),
        ],
    )


def bootstrap_folder(cfg: RunConfig) -> Path:
    """Where `run_bootstrap` writes: model.path's parent when model.path is set (it must name a `model`
    folder), else output_dir."""
    if cfg.model.path is None:
        return Path(cfg.output_dir)
    path = Path(cfg.model.path)
    if path.name != "model":
        raise ConfigError(
            f"model.path: got {cfg.model.path}; a bootstrapped policy is written to <folder>/model, so "
            "model.path must end in /model to be bootstrapped (e.g. runs/quickstart/model)"
        )
    return path.parent


def run_bootstrap(cfg: RunConfig) -> dict:
    """SFT a base policy per `cfg`; returns the card (also written to <bootstrap_folder(cfg)>/card.json)."""
    start = time.perf_counter()
    out = bootstrap_folder(cfg)
    L.seed_everything(cfg.seed, verbose=False)
    mix = task_mix(cfg.data)
    if not set(mix.families) & set(GYM_FAMILIES):
        raise ConfigError(
            f"data.families: tlt bootstrap fine-tunes on step-by-step solutions, which tlt writes for "
            f"{', '.join(GYM_FAMILIES)} only; got {list(mix.families)} (other families serve as RL prompts and "
            "evaluation problems)"
        )
    problems = [p for p in training_problems(mix, cfg.data.train_size, cfg.data.seed) if p.solution]
    prompts = [format_prompt(p.question) for p in problems]
    responses = [format_response(p.solution) for p in problems]
    tokenizer = _tokenizer(cfg, [p + r for p, r in zip(prompts, responses, strict=False)], out / "tokenizer")
    model = build_model(
        cfg.model.preset,
        len(tokenizer),
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        seed=cfg.model.seed,
    )
    examples = encode_examples(prompts, responses, tokenizer, cfg.bootstrap.max_length)
    b = cfg.bootstrap
    epochs = -(-b.max_steps * b.batch_size * b.devices // max(1, len(examples))) + 1
    data = SFTDataModule(examples, b.batch_size, tokenizer.pad_token_id, cfg.seed, epochs)
    module = SFTModule(model.train(), b.lr, b.warmup_steps, b.max_steps, b.weight_decay)
    trainer = _trainer(cfg, out / "checkpoints")
    last = out / "checkpoints" / "last.ckpt"
    trainer.fit(module, datamodule=data, ckpt_path=str(last) if last.is_file() else None)
    if not trainer.is_global_zero:
        return {}
    model = module.model.eval()
    save_hf_folder(model, tokenizer, out / "model")
    report = evaluate(
        model,
        tokenizer,
        heldout_problems(mix, cfg.data.heldout_size, cfg.data.seed),
        cfg.eval.max_new_tokens,
        cfg.eval.batch_size,
    )
    card = {
        "preset": cfg.model.preset,
        "parameters": count_parameters(model),
        "seed": cfg.seed,
        "data": asdict(cfg.data),
        "bootstrap": asdict(cfg.bootstrap),
        "train_examples": len(examples),
        "heldout": report.to_dict(),
        "seconds": time.perf_counter() - start,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    atomic_write_json(out / "card.json", card)
    print(f"[tlt] base policy saved to {out / 'model'}: {report.summary()}")
    return json.loads(json.dumps(card))

"""`tlt train`: GRPO from a bootstrapped policy with TLT's adaptive speculative rollouts, in one process.

Runs `grpo.steps` `RLTrainer` steps on training problems of the data mix, printing a progress line per step
and logging metrics to `<output_dir>/metrics.csv` (and TensorBoard); every `train.checkpoint_every` steps
and after the last one it writes a checkpoint (`tlt.training.checkpoint`); at the end `summary.png` and
`summary.json`. Device: `train.device` (auto: CUDA when available, else CPU); float32 either way.

Resume: an output_dir holding a checkpoint continues from it, at the step after the checkpoint's (metrics of
later steps, written before a crash, are dropped and recomputed). Only `grpo.steps`, `train.*` and
`output_dir` may change on resume. The resumed run equals the uninterrupted one bit for bit (policy,
drafter, optimizer states, every metric except the `*_seconds` timings) when the tuner's choices do not
depend on timing: `speculative.tuner` off or fixed, or SD off, on CPU (tests/training/test_train_cli.py).
The `beg`, `ucb1` and `cost` tuners choose plain decoding or a strategy per decode step from measured step
times, and plain and SD steps draw from the engine's sampling generator differently: where two choices are
close, timing noise can flip a decision and change every later token, so even two uninterrupted runs are
not guaranteed to match. A resume restores those tuners' learned state and RNG exactly; only the clock is
new. On CUDA, kernels with nondeterministic reductions can also break bitwise identity (not checked).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tlt.config import ConfigError, RunConfig, to_yaml
from tlt.data.rewards import math_rewards
from tlt.data.splits import task_mix, training_problems
from tlt.models.io import atomic_write_json, atomic_write_text, load_hf_folder
from tlt.training.checkpoint import (
    config_changes,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    saved_config,
)
from tlt.training.rl_loop import RewardFn, RLTrainer
from tlt.training.run_log import MetricsLog, plot_summary, progress_line


def run_train(cfg: RunConfig, reward_fn: RewardFn = math_rewards) -> dict:
    """Train (or resume) per `cfg`; returns the summary (also written to `<output_dir>/summary.json`)."""
    out = Path(cfg.output_dir)
    device = _device(cfg.train.device)
    problems = training_problems(task_mix(cfg.data), cfg.data.train_size, cfg.data.seed)
    trainer, history = _start(cfg, out, problems, reward_fn, device)
    atomic_write_text(out / "config.yaml", to_yaml(cfg))
    log = MetricsLog(out, history, cfg.train.tensorboard)
    try:
        while trainer.step_index < cfg.grpo.steps:
            metrics = trainer.step()
            history.append(metrics.to_dict())
            log.append(metrics)
            print(progress_line(metrics, cfg.grpo.steps), flush=True)
            step = trainer.step_index
            if step % cfg.train.checkpoint_every == 0 or step == cfg.grpo.steps:
                save_checkpoint(out, trainer, history)
    finally:
        log.close()
    return _finish(cfg, out, history)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: got 'cuda' but torch sees no CUDA device; use cpu or auto")
    return torch.device(name)


def _start(
    cfg: RunConfig, out: Path, problems, reward_fn: RewardFn, device: torch.device
) -> tuple[RLTrainer, list[dict]]:
    """A fresh trainer on model.path, or the output_dir checkpoint's trainer; with the steps done so far."""
    folder = find_checkpoint(out)
    if folder is None:
        policy, tokenizer = _base_policy(cfg)
        trainer = RLTrainer(cfg, policy, tokenizer, problems, reward_fn=reward_fn, device=device)
        random.seed(cfg.seed)  # global RNGs: seeded once everything is built, restored from a checkpoint
        torch.manual_seed(cfg.seed)
        return trainer, []
    changed = config_changes(saved_config(folder), cfg)
    if changed:
        raise ConfigError(
            f"{out} holds a checkpoint written under another config ({', '.join(changed)} changed); only "
            "grpo.steps and train.* may change on resume: restore those keys or pick a new output_dir"
        )
    trainer, history = load_checkpoint(folder, cfg, problems, reward_fn, device)
    print(f"[tlt] resuming {out} after step {trainer.step_index} (policy version {trainer.version})")
    if trainer.step_index >= cfg.grpo.steps:
        print(f"[tlt] the checkpoint already has {trainer.step_index} >= grpo.steps={cfg.grpo.steps} steps")
    return trainer, history


def _base_policy(cfg: RunConfig):
    path = cfg.model.path
    if not path:
        raise ConfigError(
            "model.path: not set; `tlt train` starts from a bootstrapped policy: run `tlt bootstrap --config "
            "configs/quickstart.yaml`, then pass model.path=runs/quickstart/model"
        )
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"model.path: {path} not found; bootstrap a base policy first (`tlt bootstrap --config "
            "configs/quickstart.yaml` writes runs/quickstart/model) or point model.path at an HF folder"
        )
    return load_hf_folder(path)


def _finish(cfg: RunConfig, out: Path, history: list[dict]) -> dict:
    if history:
        plot_summary(history, out / "summary.png")
    summary = {"output_dir": str(out), "steps": len(history), "policy": str(out / "checkpoint" / "policy")}
    summary |= {
        "speculative": cfg.speculative.enabled,
        "tuner": cfg.speculative.tuner if cfg.speculative.enabled else None,
        "scheduler": cfg.scheduler.policy,
    }
    if history:
        summary |= _totals(history)
    atomic_write_json(out / "summary.json", summary)
    return summary


def _totals(history: list[dict]) -> dict:
    def mean(key: str) -> float:
        return sum(m[key] for m in history) / len(history)

    seconds = {
        part: sum(m[f"{part}_seconds"] for m in history) for part in ("rollout", "train", "drafter", "push")
    }
    sd_steps = [m["accept_length"] for m in history if m["accept_length"] > 0]
    return {
        "reward_first": history[0]["reward_mean"],
        "reward_last": history[-1]["reward_mean"],
        "accuracy_last": history[-1]["accuracy"],
        "reward_mean": mean("reward_mean"),
        "response_len_mean": mean("response_len_mean"),
        "accept_length_mean": sum(sd_steps) / len(sd_steps) if sd_steps else 0.0,
        "sd_token_share_mean": mean("sd_token_share"),
        "seconds": seconds | {"total": sum(seconds.values())},
        "step_seconds_mean": sum(seconds.values()) / len(history),
    }

"""`tlt train`: GRPO from a bootstrapped policy with TLT's adaptive speculative rollouts, in one process or
in `train.devices` processes (below).

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

Several processes (`tlt.training.distributed.data_parallel`): with `train.devices=N > 1` on CPU, `tlt train` spawns N
gloo ranks itself (`tlt.training.distributed.launch`); under torchrun (RANK and WORLD_SIZE set, e.g. `torchrun
--nproc-per-node 8 -m tlt.cli train ...`, also across nodes and under SLURM) it runs as one rank of that
job, with nccl on CUDA (one GPU per rank, cuda:LOCAL_RANK) and gloo on CPU, and `train.devices` must be 1
or WORLD_SIZE. Each rank rolls out its share of every step's prompts with its own engine and trains its
drafter replica while others still roll out; the policy update is data-parallel and equal to one process's
over the same rollouts. Rank 0 alone prints, logs metrics and writes checkpoints and the summary; every
rank reads model.path and resumes from the checkpoint, so across nodes output_dir and model.path must be
on a shared filesystem. A multi-process run is not bitwise reproducible under `spot` (how many micro-steps
fit in the idle time depends on timing) and resumes only with the same number of processes. The summary
adds `devices` and `replicas_identical` (every rank ended with bit-identical policy and drafter weights).
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
from functools import partial
from pathlib import Path

import torch

from tlt.config import ConfigError, RunConfig, to_yaml
from tlt.data.rewards import math_rewards
from tlt.data.splits import rl_problems
from tlt.drafters import check_drafter_folder
from tlt.eval.compare import response_tokens
from tlt.files import atomic_write_json, atomic_write_text
from tlt.models.io import check_hf_folder, load_hf_folder
from tlt.training.checkpoint import (
    check_checkpoint,
    config_changes,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    saved_config,
)
from tlt.training.drafter.checkpoint import check_drafter_state
from tlt.training.rl_loop import RewardFn, RLTrainer
from tlt.training.run_log import MetricsLog, plot_summary, progress_line


def run_train(cfg: RunConfig, reward_fn: RewardFn = math_rewards) -> dict | None:
    """Train (or resume) per `cfg`; returns the summary (also written to `<output_dir>/summary.json`), or
    None on a rank other than 0 under torchrun. `reward_fn` must be picklable when ranks are spawned.

    With `train.bootstrap_if_missing` a missing model.path is bootstrapped first; with `train.compare_baseline`
    the same run with TLT off follows in `<output_dir>/baseline` (or the two take turns of
    `train.compare_turn_steps` steps) and the summary gains the comparison (`tlt.eval.compare`)."""
    from tlt.training.distributed.data_parallel import check_world

    check_world(cfg, world_size(cfg))  # before a bootstrap: what the run's processes allow
    check_data_paths(cfg)
    if cfg.train.bootstrap_if_missing:
        _bootstrap_if_missing(cfg)
    if not cfg.train.compare_baseline:
        return _train(cfg, reward_fn)
    return _train_and_compare(cfg, reward_fn)


def _train_and_compare(cfg: RunConfig, reward_fn: RewardFn) -> dict | None:
    """The run, and the same run with TLT off in <output_dir>/baseline, in turns of train.compare_turn_steps
    steps (each turn resumes its arm's checkpoint), then the comparison."""
    from tlt.eval.compare import baseline_config, compare

    base_cfg = baseline_config(cfg)
    steps = cfg.grpo.steps
    turn = cfg.train.compare_turn_steps or max(steps, 1)
    for end in [*range(turn, steps, turn), steps]:
        summary = _train(_stopping_after(cfg, end), reward_fn)
        if summary is None:  # a rank other than 0 under torchrun
            return None
        print(f"[tlt] steps to {end} with TLT off, for comparison: {base_cfg.output_dir}", flush=True)
        _train(_stopping_after(base_cfg, end), reward_fn)
    result = compare(cfg, Path(cfg.output_dir), Path(base_cfg.output_dir))
    print(f"[tlt] {result.summary()}", flush=True)
    print(f"[tlt] comparison: {Path(cfg.output_dir) / 'speedup.md'}", flush=True)
    return summary | {"comparison": result.to_dict()}


def _stopping_after(cfg: RunConfig, step: int) -> RunConfig:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, stop_after=step))


def last_step(cfg: RunConfig) -> int:
    """The step this run stops after: train.stop_after when set, else grpo.steps."""
    return min(cfg.train.stop_after or cfg.grpo.steps, cfg.grpo.steps)


def _bootstrap_if_missing(cfg: RunConfig) -> None:
    if cfg.model.path and Path(cfg.model.path).is_dir():
        return
    if under_torchrun():
        raise ConfigError(
            "train.bootstrap_if_missing: not under torchrun (every rank would bootstrap); run `tlt bootstrap "
            "--config CONFIG` once, then launch the ranks"
        )
    from tlt.training.bootstrap import bootstrap_folder, run_bootstrap

    if cfg.model.path is None:
        raise ConfigError("train.bootstrap_if_missing: set model.path (e.g. runs/quickstart/model) to bootstrap into")
    print(f"[tlt] {cfg.model.path} not found: bootstrapping the base policy into {bootstrap_folder(cfg)}", flush=True)
    run_bootstrap(cfg)


def _train(cfg: RunConfig, reward_fn: RewardFn) -> dict | None:
    world = world_size(cfg)
    if world > 1:
        return _run_ranks(cfg, reward_fn, world)
    out = Path(cfg.output_dir)
    device = resolve_device(cfg.train.device)
    problems = rl_problems(cfg.data)
    trainer, history = _start(cfg, out, problems, reward_fn, device)
    atomic_write_text(out / "config.yaml", to_yaml(cfg))
    log = MetricsLog(out, history, cfg.train.tensorboard)
    try:
        while trainer.step_index < last_step(cfg):
            metrics = trainer.step()
            history.append(metrics.to_dict())
            log.append(metrics)
            print(progress_line(metrics, cfg.grpo.steps), flush=True)
            step = trainer.step_index
            if step % cfg.train.checkpoint_every == 0 or step == last_step(cfg):
                save_checkpoint(out, trainer, history)
    finally:
        log.close()
        trainer.close()
    return _finish(cfg, out, history)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def world_size(cfg: RunConfig) -> int:
    """Processes of the run: torchrun's WORLD_SIZE under torchrun, else `train.devices`."""
    if not under_torchrun():
        return cfg.train.devices
    world = int(os.environ["WORLD_SIZE"])
    if cfg.train.devices not in (1, world):
        raise ConfigError(
            f"train.devices: got {cfg.train.devices} but this process runs under torchrun with "
            f"WORLD_SIZE={world}; the launcher decides: leave train.devices at 1 or set it to {world}"
        )
    return world


def _run_ranks(cfg: RunConfig, reward_fn: RewardFn, world: int) -> dict | None:
    """This process as one rank of torchrun's job, or N spawned CPU ranks."""
    import torch.distributed as dist

    from tlt.training.distributed.launch import context_from_process_group, launch_cpu

    if under_torchrun():
        _preflight(cfg, world)  # every rank: all of them stop on a config error, none waits for another
        device = resolve_device(cfg.train.device)
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        created = not dist.is_initialized()
        if created:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        try:
            return _rank_main(context_from_process_group(device), cfg, reward_fn)
        finally:
            if created:
                dist.destroy_process_group()
    if resolve_device(cfg.train.device).type == "cuda":
        raise ConfigError(
            f"train.devices={world} on CUDA: start one process per GPU with torchrun, e.g. `torchrun "
            f"--nproc-per-node {world} -m tlt.cli train CONFIG` (or set train.device=cpu to spawn CPU ranks)"
        )
    _preflight(cfg, world)
    return launch_cpu(_spawned_rank, world, cfg, reward_fn, timeout_s=None)[0]


def _preflight(cfg: RunConfig, world: int) -> None:
    """The config errors a rank would hit, raised before any process starts."""
    from tlt.training.distributed.data_parallel import check_world
    from tlt.training.rl_loop import check_rl_config

    check_rl_config(cfg)
    check_world(cfg, world)
    folder = _resumable(cfg, Path(cfg.output_dir))
    if folder is None:
        check_start_paths(cfg)
    else:
        check_checkpoint(folder, cfg, world)


def _spawned_rank(ctx, cfg: RunConfig, reward_fn: RewardFn) -> dict | None:
    return _rank_main(ctx, cfg, reward_fn)


def _rank_main(ctx, cfg: RunConfig, reward_fn: RewardFn) -> dict | None:
    """One rank's run (collective with the others); the summary on rank 0, None elsewhere."""
    import torch.distributed as dist

    from tlt.training.distributed.data_parallel import DistributedRLTrainer, save_distributed_checkpoint, weights_digest

    rank, world, lead = ctx.rank, ctx.world_size, ctx.rank == 0
    out = Path(cfg.output_dir)
    problems = rl_problems(cfg.data)
    found = [_resumable(cfg, out) if lead else None]
    dist.broadcast_object_list(found, src=0)  # every rank resumes from the checkpoint rank 0 found
    make = partial(DistributedRLTrainer, store=ctx.store)
    if found[0] is None:
        policy, tokenizer = _base_policy(cfg)
        trainer = make(cfg, policy, tokenizer, problems, reward_fn=reward_fn, device=ctx.device)
        random.seed(cfg.seed + rank)
        torch.manual_seed(cfg.seed + rank)
        history: list[dict] = []
    else:
        trainer, history = load_checkpoint(found[0], cfg, problems, reward_fn, ctx.device, make, rank, world)
        if lead:
            print(f"[tlt] resuming {out} after step {trainer.step_index} (policy version {trainer.version})")
    log = None
    if lead:
        atomic_write_text(out / "config.yaml", to_yaml(cfg))
        log = MetricsLog(out, history, cfg.train.tensorboard)
    try:
        while trainer.step_index < last_step(cfg):
            metrics = trainer.step()
            history.append(metrics.to_dict())
            if lead:
                log.append(metrics)
                print(progress_line(metrics, cfg.grpo.steps), flush=True)
            step = trainer.step_index
            if step % cfg.train.checkpoint_every == 0 or step == last_step(cfg):
                save_distributed_checkpoint(out, trainer, history)
    finally:
        if log is not None:
            log.close()
        trainer.close()
    digests = [None] * world
    dist.all_gather_object(digests, weights_digest(trainer))
    summary = None
    if lead:
        identical = len(set(digests)) == 1
        if not identical:
            print(f"[tlt] WARNING: the ranks' policy / drafter replicas differ: {digests}", file=sys.stderr)
        summary = _finish(cfg, out, history, {"devices": world, "replicas_identical": identical})
    dist.barrier()  # rank 0 may host the store: the others leave after it is done
    return summary


def resolve_device(name: str) -> torch.device:
    """`train.device` as a torch device (auto: CUDA when available, else CPU); ConfigError for an absent CUDA."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: got 'cuda' but torch sees no CUDA device; use cpu or auto")
    return torch.device(name)


def _start(
    cfg: RunConfig, out: Path, problems, reward_fn: RewardFn, device: torch.device
) -> tuple[RLTrainer, list[dict]]:
    """A fresh trainer on model.path, or the output_dir checkpoint's trainer; with the steps done so far."""
    folder = _resumable(cfg, out)
    if folder is None:
        policy, tokenizer = _base_policy(cfg)
        trainer = RLTrainer(cfg, policy, tokenizer, problems, reward_fn=reward_fn, device=device)
        random.seed(cfg.seed)  # global RNGs: seeded once everything is built, restored from a checkpoint
        torch.manual_seed(cfg.seed)
        return trainer, []
    trainer, history = load_checkpoint(folder, cfg, problems, reward_fn, device)
    print(f"[tlt] resuming {out} after step {trainer.step_index} (policy version {trainer.version})")
    if trainer.step_index >= last_step(cfg):
        print(f"[tlt] the checkpoint already has {trainer.step_index} >= {last_step(cfg)} steps")
    return trainer, history


def _resumable(cfg: RunConfig, out: Path) -> Path | None:
    """The output_dir's checkpoint folder (None: a fresh run); ConfigError if `cfg` may not resume it."""
    folder = find_checkpoint(out)
    if folder is None:
        return None
    changed = config_changes(saved_config(folder), cfg)
    if changed:
        raise ConfigError(
            f"{out} holds a checkpoint written under another config ({', '.join(changed)} changed); only "
            "grpo.steps and train.* may change on resume: restore those keys or pick a new output_dir"
        )
    return folder


def _base_policy(cfg: RunConfig):
    check_start_paths(cfg)
    return load_hf_folder(cfg.model.path)


def check_start_paths(cfg: RunConfig) -> None:
    """What a fresh run reads besides the config, checked before anything loads: model.path, and drafter.path
    when SD is on and one is given. Raises ConfigError / FileNotFoundError with the command that makes it."""
    _check_model_path(cfg)
    check_data_paths(cfg)
    path = cfg.drafter.path
    if not (cfg.speculative.enabled and path):
        return
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"drafter.path: {path} not found; distil one first: `tlt train-drafter {cfg.model.path} --output {path}`"
        )
    try:
        check_drafter_folder(path)
        check_drafter_state(path)  # an async drafter checkpoint's optimizer state
    except (FileNotFoundError, ValueError) as e:  # not a drafter's folder, or a damaged one
        raise ConfigError(f"drafter.path: {e}") from e


def check_data_paths(cfg: RunConfig) -> None:
    """Every data.jsonl file exists and reads (DataError naming the file and line), before any process starts."""
    from tlt.data.jsonl import read_problems

    for data in cfg.data.jsonl:
        if not Path(data).is_file():
            raise FileNotFoundError(f"data.jsonl: {data} not found (a GSM8K- or MATH-format JSONL file of RL prompts)")
        read_problems(data)


def _check_model_path(cfg: RunConfig) -> None:
    path = cfg.model.path
    if not path:
        raise ConfigError(
            "model.path: not set; `tlt train` starts from a base policy: the one that comes with tlt "
            "(model.path='${asset:deep_v2/policy}' model.preset=deep), or one of your own (`tlt bootstrap --preset "
            "tiny --output-dir runs/tiny`, then model.path=runs/tiny/model)"
        )
    if not Path(path).is_dir():
        folder = Path(path)
        make = (
            f"`tlt bootstrap --preset {cfg.model.preset} --output-dir {folder.parent}` writes {path}, or add "
            "train.bootstrap_if_missing=true"
            if folder.name == "model"
            else f"`tlt bootstrap --preset {cfg.model.preset} --output-dir runs/base` writes runs/base/model"
        )
        raise FileNotFoundError(
            f"model.path: {path} not found; bootstrap a base policy first ({make}) or point model.path at an HF folder"
        )
    try:
        check_hf_folder(path)
    except (FileNotFoundError, ValueError) as e:  # no config.json, or a damaged file
        raise ConfigError(f"model.path: {e}") from e


def _finish(cfg: RunConfig, out: Path, history: list[dict], extra: dict | None = None) -> dict:
    if history:
        plot_summary(history, out / "summary.png")
    summary = {"output_dir": str(out), "steps": len(history), "policy": str(out / "checkpoint" / "policy")}
    summary |= {"devices": 1} | (extra or {})
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

    seconds = {part: sum(m[f"{part}_seconds"] for m in history) for part in ("rollout", "train", "drafter", "push")}
    sd_steps = [m["accept_length"] for m in history if m["accept_length"] > 0]
    return {
        "reward_first": history[0]["reward_mean"],
        "reward_last": history[-1]["reward_mean"],
        "accuracy_last": history[-1]["accuracy"],
        "reward_mean": mean("reward_mean"),
        "response_len_mean": mean("response_len_mean"),
        "response_tokens": round(response_tokens(history)),
        "accept_length_mean": sum(sd_steps) / len(sd_steps) if sd_steps else 0.0,
        "sd_token_share_mean": mean("sd_token_share"),
        "spot_steps": sum(m.get("spot_steps", 0) for m in history),  # drafter micro-steps in idle time
        "idle_train_seconds": sum(m.get("idle_train_seconds", 0.0) for m in history),
        "seconds": seconds | {"total": sum(seconds.values())},
        "step_seconds_mean": sum(seconds.values()) / len(history),
    }

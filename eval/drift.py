"""Policy drift: does the online (adaptive) drafter keep its acceptance length while the policy changes, and
how far does a frozen drafter fall behind?

One GRPO run (`tlt.training.rl_loop.RLTrainer`, the config's settings) starts from the base policy and an
offline-distilled EAGLE drafter (`--drafter`). The run trains its copy of the drafter online from the policy's
own hidden states (scheduler.policy=spot; in one process: `scheduler.between_steps_budget` micro-steps per
step); the frozen drafter is the untouched offline one. Before the first step and after every step both
drafters are measured against the *current* policy on the same `--eval-prompts` held-out problems: greedy
decoding with the fixed chain `--strategy`, accept length = tokens per verify and row (accepted drafts + 1).
A paired measurement on fixed prompts, so the ratio is not the noise of each step's different rollouts.
Drift is shown as the share of those greedy responses that differ from the base policy's.

  OMP_NUM_THREADS=1 python -m eval.drift --config configs/tlt.yaml --drafter runs/quickstart/drafter \
      --steps 12 --out runs/drift grpo.lr=3e-4 scheduler.between_steps_budget=30

A drafter trained on other data than the RL prompts (the usual case with an off-the-shelf drafter) shows how
fast online training adapts it to the workload, e.g. one distilled on `products` problems alone:

  tlt train-drafter runs/quickstart/model --output runs/drafter-products "data.families=[products]" \
      "data.weights=[1.0]"
  OMP_NUM_THREADS=1 python -m eval.drift --drafter runs/drafter-products --steps 12 --out runs/drift-offdist \
      scheduler.between_steps_budget=30
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from tlt.backends.base import SamplingParams  # noqa: E402
from tlt.backends.native import NativeEngine  # noqa: E402
from tlt.files import atomic_save_figure, subplots, write_report  # noqa: E402
from tlt.machine import describe_machine  # noqa: E402
from tlt.schedulers.tuners.base import FixedTuner  # noqa: E402
from tlt.training.rl_loop import decode_stats  # noqa: E402


def measure(policy, eos: int, drafter, prompts, strategy: str, max_new_tokens: int, temperature: float = 0.0):
    """(accept length, responses) of `drafter` against `policy` on `prompts` (greedy, or sampled with seed 0)."""
    engine = NativeEngine(
        copy.deepcopy(policy),
        eos,
        max(len(p) for p in prompts) + max_new_tokens + 1,
        tuner=FixedTuner(strategy, 10**6),
        drafter=drafter.clone(),
    )
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=0)
    rollouts = engine.generate(prompts, sampling)
    return decode_stats(engine.step_stats)[0], [r.token_ids.tolist() for r in rollouts]


def run(args) -> dict:
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix, training_problems
    from tlt.drafters import load_drafter
    from tlt.models.io import load_hf_folder
    from tlt.training.rl_loop import RLTrainer

    torch.set_num_threads(1)
    overrides = [
        "speculative.tuner=fixed",
        f"speculative.strategies=['{args.strategy}']",
        "speculative.threshold=1000000",
        "scheduler.policy=spot",
        f"grpo.steps={args.steps}",
        f"drafter.path={args.drafter}",
        f"output_dir={Path(args.out) / 'run'}",
        *args.overrides,
    ]
    cfg = load_config(args.config, overrides)
    policy, tokenizer = load_hf_folder(cfg.model.path)
    frozen = load_drafter(args.drafter)
    mix = task_mix(cfg.data)
    problems = training_problems(mix, cfg.data.train_size, cfg.data.seed)
    prompts = [tokenizer.encode(format_prompt(p.question)) for p in heldout_problems(mix, args.eval_prompts, 0)]
    trainer = RLTrainer(cfg, policy, tokenizer, problems, drafter=load_drafter(args.drafter))

    def accept(drafter) -> tuple[float, list]:
        eos, T = tokenizer.eos_token_id, args.temperature
        return measure(trainer.policy, eos, drafter, prompts, args.strategy, args.max_new_tokens, T)

    _, base = accept(frozen)
    rows = []
    for step in range(args.steps + 1):
        if step:
            metrics = trainer.step()
        a_frozen, responses = accept(frozen)
        a_online, _ = accept(trainer.drafter)
        changed = sum(r != b for r, b in zip(responses, base, strict=True)) / len(base)
        row = {"step": step, "frozen": a_frozen, "adaptive": a_online, "changed": changed}
        if step:
            row |= {"reward": metrics.reward_mean, "drafter_steps": metrics.drafter_steps, "loss": metrics.drafter_loss}
        rows.append(row)
        print(
            f"[drift] after step {step}: frozen {a_frozen:.2f}  adaptive {a_online:.2f}  changed {changed:.0%}",
            flush=True,
        )
    trainer.close()
    return {"settings": vars(args), "config_overrides": overrides, "rows": rows, "machine": describe_machine()}


def render(report: dict, png: str = "drift.png") -> str:
    s, rows = report["settings"], report["rows"]
    last = rows[-1]
    lines = [
        "# Policy drift: frozen vs adaptive EAGLE drafter",
        "",
        f"One GRPO run of `{s['config']}` ({' '.join(s['overrides'])}), {s['steps']} steps; after each step both "
        f"drafters are measured against the current policy on the same {s['eval_prompts']} held-out prompts "
        f"({_decoding(s)}, chain {s['strategy']}, up to {s['max_new_tokens']} tokens). Accept length = tokens "
        "per verify and row. 'changed' = share of those responses (frozen drafter's run) that differ from the "
        "base policy's.",
        "",
        "| step | frozen | adaptive | adaptive / frozen | changed vs base | reward | drafter micro-steps |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['frozen']:.2f} | {r['adaptive']:.2f} | {r['adaptive'] / r['frozen']:.2f}x | "
            f"{r['changed']:.0%} | {r.get('reward', float('nan')):.3f} | {r.get('drafter_steps', 0)} |"
        )
    lines += [
        "",
        f"At step {last['step']}: adaptive / frozen = {last['adaptive'] / last['frozen']:.2f}x "
        f"(frozen {rows[0]['frozen']:.2f} -> {last['frozen']:.2f}, adaptive {rows[0]['adaptive']:.2f} -> "
        f"{last['adaptive']:.2f}). Plot: {png}.",
        "",
        "Machine: " + json.dumps(report["machine"]),
    ]
    return "\n".join(lines) + "\n"


def _decoding(settings: dict) -> str:
    T = settings.get("temperature", 0.0)
    return "greedy" if T == 0 else f"sampled at temperature {T}, seed 0"


def plot(rows: list[dict], out: Path) -> None:
    fig, ax = subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["frozen"] for r in rows], marker="o", label="frozen offline drafter")
    ax.plot(steps, [r["adaptive"] for r in rows], marker="o", label="adaptive drafter (trained online)")
    ax.set_xlabel("RL step (policy updates)")
    ax.set_ylabel("accept length (tokens per verify)")
    twin = ax.twinx()
    twin.plot(steps, [r["changed"] for r in rows], color="grey", linestyle="--", label="responses changed")
    twin.set_ylabel("responses changed vs base")
    twin.set_ylim(0, 1)
    ax.legend(loc="lower left")
    fig.tight_layout()
    atomic_save_figure(fig, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tlt.yaml")
    p.add_argument("--drafter", default="tlt/assets/deep_v2/drafter", help="the offline-distilled EAGLE drafter")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--strategy", default="4_1_5")
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; the RL rollouts sample at 1.0")
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report = run(args)
    report["seconds"] = time.perf_counter() - start
    plot(report["rows"], out / "drift.png")
    print(write_report(out / "drift.md", report, render))
    return 0


if __name__ == "__main__":
    sys.exit(main())

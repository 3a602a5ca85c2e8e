"""Rollout throughput of the vLLM backend against the native engine on one workload, SD off and on; and the
end-to-end RL step time with each backend.

Run it in the vLLM environment (`make vllm-env`). Every configuration gets its own engine, started once; then
`--repeats` rounds run the configurations in turn on the same prompts (a long-tailed rollout: `--prompts`
held-out problems of the config's data mix x `--samples` samples, until EOS or `--max-new-tokens`), with the
same seed per round. Reported per configuration: medians over the rounds of wall seconds, generated tokens,
tokens/s and its ratio to native plain decoding, accept length, engine start seconds, and the resident memory
of this process plus the engines' processes. With --temperature 0 the greedy outputs are also compared token
for token with native plain decoding.

SD setups share one schedule so they compare like for like: a chain `--strategy` with the EAGLE drafter
`--eagle` while at most `--sd-max-batch` sequences run (vLLM's dynamic SD; the native engine's `fixed` tuner);
`native-adaptive` adds the native engine with its cost tuner over `--adaptive-strategies`.

  .venv-vllm/bin/python -m eval.bench_backends --target runs/quickstart/model --eagle runs/quickstart/drafter \
      --config configs/quickstart.yaml --prompts 16 --samples 8 --max-new-tokens 512 --repeats 3 \
      --out runs/bench-backends
  .venv-vllm/bin/python -m eval.bench_backends --e2e configs/vllm.yaml --steps 6 --out runs/bench-backends-e2e
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

import torch  # noqa: E402

from tlt.backends.base import SamplingParams  # noqa: E402
from tlt.eval.train_runs import train_metrics  # noqa: E402
from tlt.files import write_report  # noqa: E402
from tlt.machine import describe_machine  # noqa: E402

SETUPS = ("native-plain", "native-sd", "native-adaptive", "vllm-plain", "vllm-sd", "vllm-ngram")


def build(setup: str, args, model, tokenizer, drafter):
    """The engine of one setup and its start seconds."""
    from tlt.backends.native import NativeEngine
    from tlt.backends.vllm import VLLMEngine
    from tlt.drafters.ngram import NgramDrafter
    from tlt.schedulers.tuners.base import FixedTuner
    from tlt.schedulers.tuners.registry import build_tuner, parse_strategy_set

    start = time.perf_counter()
    eos, limit = tokenizer.eos_token_id, args.max_seq_len
    if setup == "native-plain":
        engine = NativeEngine(model, eos, limit)
    elif setup == "native-sd":
        engine = NativeEngine(model, eos, limit, tuner=FixedTuner(args.strategy, args.sd_max_batch), drafter=drafter)
    elif setup == "native-adaptive":
        tuner = build_tuner("cost", parse_strategy_set(args.adaptive_strategies), seed=0)
        engine = NativeEngine(model, eos, limit, tuner=tuner, drafter=drafter)
    elif setup == "vllm-plain":
        engine = VLLMEngine(args.target, eos, limit)
    elif setup == "vllm-sd":
        engine = VLLMEngine(args.target, eos, limit, drafter, args.strategy, args.sd_max_batch)
    else:
        engine = VLLMEngine(args.target, eos, limit, NgramDrafter(3, 1), args.strategy, args.sd_max_batch)
    return engine, time.perf_counter() - start


def accept_length(engine) -> float:
    sd = [s for s in engine.step_stats if s.sd_on]
    rows = sum(s.running_batch for s in sd)
    return (sum(s.accepted_tokens for s in sd) + rows) / rows if rows else 0.0


def resident_mib() -> float:
    """RSS of this process and its children (vLLM's engine processes), in MiB."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def run_rollouts(args) -> dict:
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.drafters import load_drafter
    from tlt.models.io import load_hf_folder

    torch.set_num_threads(1)
    model, tokenizer = load_hf_folder(args.target)
    drafter = load_drafter(args.eagle)
    problems = heldout_problems(task_mix(load_config(args.config).data), args.prompts, seed=args.seed)
    prompts = [tokenizer.encode(format_prompt(p.question)) for p in problems]
    setups = args.setups.split(",")
    engines, starts = {}, {}
    for setup in setups:
        engines[setup], starts[setup] = build(setup, args, model, tokenizer, drafter)
        print(f"[bench] {setup}: engine started in {starts[setup]:.1f}s", flush=True)
    runs = {s: [] for s in setups}
    outputs = {}
    for round_ in range(args.repeats):
        sampling = SamplingParams(args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed + round_)
        for setup in setups:
            engine = engines[setup]
            start = time.perf_counter()
            rollouts = engine.generate(prompts, sampling, n=args.samples)
            seconds = time.perf_counter() - start
            tokens = sum(r.token_ids.numel() for r in rollouts)
            runs[setup].append({"seconds": seconds, "tokens": tokens, "accept": accept_length(engine)})
            outputs[setup] = [r.token_ids.tolist() for r in rollouts]
            print(f"[bench] round {round_ + 1}/{args.repeats} {setup}: {tokens} tokens in {seconds:.2f}s", flush=True)
    memory = resident_mib()
    for engine in engines.values():
        engine.close()
    return summarize(args, setups, runs, starts, outputs, memory)


def summarize(args, setups, runs, starts, outputs, memory) -> dict:
    rows = {}
    for setup in setups:
        med = {k: statistics.median(r[k] for r in runs[setup]) for k in ("seconds", "tokens", "accept")}
        rates = [r["tokens"] / r["seconds"] for r in runs[setup]]
        rows[setup] = med | {"tokens_per_s": statistics.median(rates), "start_seconds": starts[setup]}
    base = rows.get("native-plain", {}).get("tokens_per_s")
    for row in rows.values():
        row["vs_native_plain"] = row["tokens_per_s"] / base if base else None
    identical = None
    if args.temperature == 0 and "native-plain" in outputs:
        identical = {s: outputs[s] == outputs["native-plain"] for s in setups}
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "machine": describe_machine(),
        "rows": rows,
        "greedy_identical_to_native_plain": identical,
        "resident_mib_all_engines": memory,
    }


def render(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# Rollout throughput: vLLM backend vs native engine",
        "",
        f"Workload: {s['prompts']} held-out prompts x {s['samples']} samples, T = {s['temperature']}, up to "
        f"{s['max_new_tokens']} new tokens; SD: {s['strategy']} with the EAGLE drafter while <= "
        f"{s['sd_max_batch']} sequences run; medians of {s['repeats']} rounds.",
        "",
        "| setup | tokens/s | vs native plain | seconds | tokens | accept length | engine start s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["rows"].items():
        ratio = "" if r["vs_native_plain"] is None else f"{r['vs_native_plain']:.2f}x"
        lines.append(
            f"| {name} | {r['tokens_per_s']:.0f} | {ratio} | {r['seconds']:.2f} | {r['tokens']:.0f} | "
            f"{r['accept']:.2f} | {r['start_seconds']:.1f} |"
        )
    identical = report["greedy_identical_to_native_plain"]
    if identical is not None:
        lines += ["", f"Greedy outputs identical to native plain decoding: {identical}"]
    lines += [
        "",
        f"Resident memory, this process + engine processes, all engines up: "
        f"{report['resident_mib_all_engines']:.0f} MiB",
        "",
        "Machine: " + json.dumps(report["machine"]),
    ]
    return "\n".join(lines) + "\n"


def run_e2e(args) -> dict:
    """`tlt train CONFIG` with rollout.backend=native and =vllm (same settings otherwise): medians over the
    steps after the first of step, rollout and train seconds."""
    rows = {}
    for backend in ("native", "vllm"):
        out = Path(args.out) / f"e2e-{backend}"
        metrics = train_metrics(args.e2e, out, args.steps, [f"rollout.backend={backend}", *args.overrides])
        parts = ("rollout_seconds", "train_seconds", "drafter_seconds", "push_seconds")
        med = {p: statistics.median(float(m[p]) for m in metrics) for p in parts}
        med["step_seconds"] = statistics.median(sum(float(m[p]) for p in parts) for m in metrics)
        med["accept_length"] = statistics.median(float(m["accept_length"]) for m in metrics)
        rows[backend] = med
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "machine": describe_machine(),
        "e2e": rows,
    }


def render_e2e(report: dict) -> str:
    s, rows = report["settings"], report["e2e"]
    lines = [
        "# End-to-end RL step: rollout.backend=vllm vs native",
        "",
        f"`tlt train {s['e2e']}` {' '.join(s['overrides'])}, {s['steps']} steps each, medians over steps 2..N.",
        "",
        "| backend | step s | rollout s | train s | drafter s | push s | accept length |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['step_seconds']:.2f} | {r['rollout_seconds']:.2f} | {r['train_seconds']:.2f} | "
            f"{r['drafter_seconds']:.2f} | {r['push_seconds']:.2f} | {r['accept_length']:.2f} |"
        )
    ratio = rows["native"]["step_seconds"] / rows["vllm"]["step_seconds"]
    lines += ["", f"Step time native / vllm: {ratio:.2f}x", "", "Machine: " + json.dumps(report["machine"])]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="runs/quickstart/model")
    p.add_argument("--eagle", default="runs/quickstart/drafter")
    p.add_argument("--config", default="configs/quickstart.yaml", help="its data section gives the prompts")
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--max-seq-len", type=int, default=768)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--strategy", default="3_1_4")
    p.add_argument("--sd-max-batch", type=int, default=8)
    p.add_argument("--adaptive-strategies", default="2_1_3,3_1_4,4_1_5")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--e2e", default=None, help="a tlt train config: measure the RL step with each backend instead")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="--e2e: key=value config overrides for both runs")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.e2e:
        print(write_report(Path(args.out) / "e2e.md", run_e2e(args), render_e2e))
    else:
        print(write_report(Path(args.out) / "backends.md", run_rollouts(args), render))
    return 0


if __name__ == "__main__":
    sys.exit(main())

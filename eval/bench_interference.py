"""What slows the rollout down under `spot`: decoding on one core while the other core trains the drafter.

Under `scheduler.policy=spot` a rank whose share is done trains the drafter while another rank still decodes.
The scheduler never lets a rank train during its own rollout, so any slowdown of the rollout comes from the
hardware the two cores share (last-level cache, memory bandwidth). This benchmark isolates it: plain native
decoding of held-out prompts on core 0 while core 1 is idle, runs a synthetic load (`LOADS`: busy, vector
math in its own cache, or streaming memory), or runs drafter micro-steps (`DrafterStepper`, the spot trainer,
on a buffer of the target's own features) at several `drafter.batch_tokens`. Conditions run in
turn for `--rounds` rounds; reported: median decode tokens/s per condition and the slowdown vs idle.

  OMP_NUM_THREADS=1 python -m eval.bench_interference --target runs/quickstart/model \
      --drafter runs/quickstart/drafter --batch-tokens 4096,1024,256 --out runs/interference
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from tlt.files import write_report  # noqa: E402
from tlt.machine import describe_machine  # noqa: E402


def held_out_prompts(target: str, count: int, seed: int) -> list[list[int]]:
    from tlt.config import DataConfig
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.models.io import load_hf_folder

    _, tokenizer = load_hf_folder(target)
    problems = heldout_problems(task_mix(DataConfig()), count, seed=seed)
    return [tokenizer.encode(format_prompt(p.question)) for p in problems]


def fill_buffer(model, prompts: list[list[int]], eos: int):
    """A drafter buffer of the target's own sampled answers with its features, as the trainer fills it."""
    from tlt.backends.base import SamplingParams
    from tlt.backends.native import NativeEngine
    from tlt.training.drafter.buffer import DrafterBuffer, DrafterSample

    engine = NativeEngine(model, eos, max_seq_len=1024)
    rollouts = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=256, seed=0))
    buffer = DrafterBuffer(256 * 2**20)
    for prompt, r in zip(prompts, rollouts, strict=True):
        ids = torch.tensor(prompt + r.token_ids.tolist())
        with torch.no_grad():
            hidden = model.model(ids[None]).last_hidden_state[0]
        mask = torch.arange(ids.numel()) >= len(prompt)
        buffer.add([DrafterSample(ids, hidden, mask, version=0)])
    return buffer


def _spin() -> None:
    sum(range(10_000))


@functools.cache
def _tensor(*shape: int) -> torch.Tensor:
    return torch.ones(shape)


def _matmul() -> None:
    small = _tensor(128, 128)  # 64 KB: stays in the core's own L2
    for _ in range(50):
        torch.mm(small, small)


def _stream() -> None:
    _tensor(16 * 2**20).mul_(1.0)  # 64 MB: twice the shared L3


# Synthetic loads for core 1 that separate the causes of a slowdown: `spin` is busy with next to no memory
# traffic (a shared core would show), `matmul` runs vector FMAs on data in its own L2 (shared execution
# units or a shared clock would show), `stream` sweeps 64 MB (shared last-level cache and memory bandwidth).
LOADS = {"spin": _spin, "matmul": _matmul, "stream": _stream}


def trainer(target: str, drafter: str, prompts, commands, done) -> None:
    """Core 1: wait for ("train", batch_tokens) / (a LOADS key, 0) / ("idle", 0) / ("stop", 0); report
    micro-steps."""
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    from tlt.config import DrafterConfig
    from tlt.drafters import load_drafter
    from tlt.models.io import load_hf_folder
    from tlt.training.drafter.spot import DrafterStepper

    model, tokenizer = load_hf_folder(target)
    eagle = load_drafter(drafter)
    eagle.bind(model)
    buffer = fill_buffer(model, prompts, tokenizer.eos_token_id)
    done.put(("ready", 0))
    while True:
        kind, batch_tokens = commands.get()
        if kind == "stop":
            return
        steps, stepper = 0, None
        if kind == "train":
            stepper = DrafterStepper(eagle.head, buffer, DrafterConfig(batch_tokens=batch_tokens))
        done.put(("started", 0))
        while commands.empty():
            if kind in LOADS:
                LOADS[kind]()
                continue
            if stepper is None:
                time.sleep(0.001)
                continue
            stepper.step()
            steps += 1
        commands.get()  # the "pause" that ended this condition
        done.put(("steps", steps))


def decode_tokens_per_second(engine, prompts, batch: int, max_new_tokens: int) -> float:
    from tlt.backends.base import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        tokens += sum(r.token_ids.numel() for r in engine.generate(prompts[i : i + batch], sampling))
    return tokens / (time.perf_counter() - start)


def speculative(args) -> dict:
    """The engine's tuner and drafter for decoding with SD (`--strategy`): the drafter, frozen, with one fixed
    strategy at every batch size; none for plain decoding."""
    if args.strategy is None:
        return {}
    from tlt.drafters import load_drafter
    from tlt.schedulers.tuners import build_tuner

    return {"tuner": build_tuner("fixed", [args.strategy], threshold=1024), "drafter": load_drafter(args.drafter)}


def run(args) -> dict:
    from tlt.backends.native import NativeEngine
    from tlt.models.io import load_hf_folder

    machine = describe_machine()  # before pinning: it reports the usable cores
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    prompts = held_out_prompts(args.target, args.prompts, args.seed)
    model, tokenizer = load_hf_folder(args.target)
    engine = NativeEngine(model, tokenizer.eos_token_id, max_seq_len=1024, **speculative(args))
    ctx = mp.get_context("spawn")
    commands, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=trainer, args=(args.target, args.drafter, prompts[:16], commands, done), daemon=True)
    proc.start()
    assert done.get()[0] == "ready"
    conditions = [("idle", 0)] + [(load, 0) for load in LOADS] + [("train", b) for b in args.batch_tokens]
    results: dict[str, dict[str, list[float]]] = {}
    decode_tokens_per_second(engine, prompts[: args.batch], args.batch, args.max_new_tokens)  # warm-up
    for round_ in range(args.rounds):
        for kind, batch_tokens in conditions:
            name = f"train@{batch_tokens}" if kind == "train" else kind
            commands.put((kind, batch_tokens))
            done.get()
            time.sleep(0.2)  # the trainer is inside its first micro-step
            speed = decode_tokens_per_second(engine, prompts, args.batch, args.max_new_tokens)
            commands.put(("pause", 0))
            steps = done.get()[1]
            row = results.setdefault(name, {"tokens_per_second": [], "micro_steps": []})
            row["tokens_per_second"].append(speed)
            row["micro_steps"].append(steps)
            print(
                f"[interference] round {round_ + 1}/{args.rounds} {name}: {speed:.0f} tok/s, {steps} micro-steps",
                file=sys.stderr,
            )
    commands.put(("stop", 0))
    proc.join(timeout=30)
    summary = summarize(results)
    return {"settings": vars(args), "machine": machine, "conditions": summary}


def summarize(results: dict[str, dict[str, list[float]]]) -> dict:
    """Per condition: median tokens/s, slowdown against the idle condition's median, median micro-steps."""
    idle = statistics.median(results["idle"]["tokens_per_second"])
    return {
        name: {
            "tokens_per_second": statistics.median(r["tokens_per_second"]),
            "slowdown": idle / statistics.median(r["tokens_per_second"]) - 1,
            "micro_steps": statistics.median(r["micro_steps"]),
            "runs": r,
        }
        for name, r in results.items()
    }


def decoding(settings: dict) -> str:
    if settings.get("strategy") is None:
        return "Plain greedy native decoding"
    return f"Greedy native decoding with SD (the frozen drafter, strategy {settings['strategy']} at every batch size)"


def render(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# Rollout slowdown from drafter training on the other core",
        "",
        f"{decoding(s)} of {s['prompts']} held-out prompts (batch {s['batch']}, up to "
        f"{s['max_new_tokens']} tokens) on core 0 of `{s['target']}`, while core 1 is idle, runs a synthetic load "
        "(spin: pure-Python loop; matmul: 128x128 matmuls in its own L2; stream: sweeps over 64 MB), or runs "
        f"spot drafter micro-steps of `{s['drafter']}` at each `drafter.batch_tokens`; {s['rounds']} "
        "rounds, conditions in turn, medians.",
        "",
        "| core 1 | decode tok/s | slowdown vs idle | drafter micro-steps meanwhile |",
        "|---|---:|---:|---:|",
    ]
    for name, row in report["conditions"].items():
        lines.append(f"| {name} | {row['tokens_per_second']:.0f} | {row['slowdown']:+.1%} | {row['micro_steps']:.0f} |")
    lines += ["", f"Machine: {json.dumps(report['machine'])}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target policy HF folder (tlt bootstrap)")
    p.add_argument("--drafter", required=True, help="EAGLE drafter folder (tlt train-drafter)")
    p.add_argument("--out", required=True, help="results folder (interference.json, interference.md)")
    p.add_argument("--batch-tokens", default="4096,1024,256", help="drafter.batch_tokens values to compare")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--batch", type=int, default=4, help="decode batch size")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--strategy", help="decode with SD: the drafter and this fixed strategy (e.g. 3_1_4)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.batch_tokens = [int(b) for b in args.batch_tokens.split(",") if b]
    except ValueError:
        p.error(f"--batch-tokens: expected comma-separated integers, got {args.batch_tokens!r}")
    if len(os.sched_getaffinity(0)) < 2:
        print("bench_interference needs 2 cores (decode on core 0, training on core 1)", file=sys.stderr)
        return 2
    print(write_report(Path(args.out) / "interference.md", run(args), render))
    return 0


if __name__ == "__main__":
    sys.exit(main())

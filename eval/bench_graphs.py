"""Benchmark the native engine's static-shape path (CUDA graphs on CUDA, uncaptured on CPU) against its eager path.

For each batch size, greedy decoding of that many held-out prompts (one sample each, a fixed number of new tokens,
no stop at EOS, so every row decodes the same tokens in both arms), plain and with speculative decoding (the given
EAGLE drafter, one fixed strategy at every step). The arms alternate within each round (eager, static, eager, ...)
and each (arm, batch) cell is warmed up once first, which on CUDA also captures its graphs. Reported: median tokens/s
over the rounds with min-max spread, the static / eager ratio, the SD / plain ratio of each path, and whether the
two paths emitted the same tokens. Writes graphs.json and graphs.md to --out.

  python -m eval.bench_graphs --target tlt/assets/deep_v2/policy --drafter tlt/assets/deep_v2/drafter \
      --batches 1,4,16 --rounds 3 --out eval/results/graphs_cpu

Exit status: 0; 1 when the paths' tokens differ; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters import load_drafter
from tlt.eval.heldout import heldout_prompt_ids
from tlt.files import write_report
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners import FixedTuner

ARMS = ("eager", "static")


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", help="EAGLE drafter folder (omit: plain decoding only)")
    parser.add_argument("--strategy", default="4_1_5", help="SD strategy at every step (default 4_1_5)")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per row")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3 for a median)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--out", required=True, help="folder for graphs.json and graphs.md")
    parser.add_argument("--render", action="store_true", help="only re-render graphs.md from --out's graphs.json")
    parser.add_argument("--target", help="HF folder of the policy")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.rounds < 1 or min(args.batches) < 1:
        parser.error("--rounds and every batch size must be >= 1")
    return args


def _engines(model, drafter, args, max_seq_len: int) -> dict:
    """(arm, sd) -> engine; the engines share the model's weights."""
    engines = {}
    for arm in ARMS:
        static = arm == "static"
        engines[arm, False] = NativeEngine(model, None, max_seq_len, device=args.device, cuda_graphs=static)
        if drafter is not None:
            tuner = FixedTuner(args.strategy, threshold=10**6)
            engines[arm, True] = NativeEngine(
                model, None, max_seq_len, tuner=tuner, drafter=drafter.clone(), device=args.device, cuda_graphs=static
            )
    return engines


def _timed(engine, prompts, sampling, device) -> tuple[float, list[list[int]], float]:
    """(tokens/s, tokens, accepted tokens per SD step + 1)."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    rollouts = engine.generate(prompts, sampling)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = [r.token_ids.tolist() for r in rollouts]
    sd = [s for s in engine.step_stats if s.sd_on]
    accept = 1 + sum(s.accepted_tokens for s in sd) / max(sum(s.running_batch for s in sd), 1)
    return sum(map(len, tokens)) / seconds, tokens, accept


def run(args) -> dict:
    model, tokenizer = load_hf_folder(args.target, getattr(torch, args.dtype))
    drafter = load_drafter(args.drafter) if args.drafter else None
    prompts = heldout_prompt_ids(tokenizer, max(args.batches))
    max_seq_len = min(max(map(len, prompts)) + args.new_tokens + 16, model.config.max_position_embeddings)
    engines = _engines(model, drafter, args, max_seq_len)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    cells: dict[str, dict] = {}
    for batch in args.batches:
        for engine in engines.values():  # warm-up (and graph capture)
            engine.generate(prompts[:batch], sampling)
        for round_ in range(args.rounds):
            for (arm, sd), engine in engines.items():
                rate, tokens, accept = _timed(engine, prompts[:batch], sampling, args.device)
                cell = cells.setdefault(f"{batch}/{'sd' if sd else 'plain'}/{arm}", {"rates": [], "tokens": tokens})
                cell["rates"].append(rate)
                cell["accept"] = accept
                cell["same_tokens"] = cell.get("same_tokens", True) and tokens == cell["tokens"]
            print(f"[bench_graphs] batch {batch} round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    return {
        "machine": describe_machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "cells": {k: {"rates": v["rates"], "accept": v["accept"], "tokens": v["tokens"]} for k, v in cells.items()},
    }


def table(results: dict) -> str:
    cells, settings = results["cells"], results["settings"]
    machine = results["machine"]
    lines = [
        f"# Native engine: static-shape path vs eager ({settings['device']}, {settings['dtype']})",
        "",
        f"Machine: {machine.get('gpu') or machine.get('cpu_model')}; torch {machine.get('torch')}. Greedy, "
        f"{settings['new_tokens']} new tokens per row, SD strategy {settings['strategy']} at every step; "
        f"median tokens/s over {settings['rounds']} interleaved rounds (min-max). Written by eval/bench_graphs.py "
        "from graphs.json.",
        "",
        "| batch | decoding | eager tok/s | static tok/s | static / eager | SD / plain (eager) | "
        "SD / plain (static) | accept | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch in settings["batches"]:
        for mode in ("plain", "sd"):
            eager, static = cells.get(f"{batch}/{mode}/eager"), cells.get(f"{batch}/{mode}/static")
            if eager is None:
                continue
            med = {arm: statistics.median(c["rates"]) for arm, c in (("eager", eager), ("static", static))}
            same = eager["tokens"] == static["tokens"]
            ratios = ["", ""]
            if mode == "sd":
                plain = {arm: statistics.median(cells[f"{batch}/plain/{arm}"]["rates"]) for arm in ARMS}
                ratios = [f"{med['eager'] / plain['eager']:.2f}x", f"{med['static'] / plain['static']:.2f}x"]
            accept = f"{eager['accept']:.2f}" if mode == "sd" else "-"
            lines.append(
                f"| {batch} | {mode} | {_spread(eager['rates'])} | {_spread(static['rates'])} | "
                f"{med['static'] / med['eager']:.2f}x | {ratios[0]} | {ratios[1]} | {accept} | "
                f"{'yes' if same else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def same_tokens(cells: dict) -> bool:
    """Whether the static-shape path emitted the eager path's tokens in every cell."""
    pairs = [(c, cells[k.replace("/eager", "/static")]) for k, c in cells.items() if k.endswith("/eager")]
    return all(eager["tokens"] == static["tokens"] for eager, static in pairs)


def _spread(rates: list[float]) -> str:
    return f"{statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f})"


def main(argv=None) -> int:
    args = _args(argv)
    out = Path(args.out)
    if args.render:
        results = json.loads((out / "graphs.json").read_text())
    else:
        if not args.target:
            raise SystemExit("bench_graphs: --target is required (or --render)")
        torch.set_num_threads(1)  # one thread per process (DESIGN.md); on CUDA the host only launches kernels
        results = run(args)
    print(write_report(out / "graphs.md", results, table))
    return 0 if same_tokens(results["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark lossless speculative decoding (SD) on the native engine against plain decoding and HF peers.

All in one process on one torch thread, on held-out math prompts of the target's data mix:
  1. plain native decoding vs HF `generate` (greedy, left-padded batches): tokens/s ratio;
  2. SD with each drafter (eagle, small_lm, ngram) and strategy on every step, at each batch size and
     temperature, vs plain native decoding of the same prompts: tokens/s, speedup, accepted length;
  3. the cost model: target forward t(b, N), draft time per step, and the speedup bound they imply;
  4. HF assisted generation (the small_lm drafter's model as assistant, prompt lookup) at batch 1 vs our
     fastest SD: tokens/s ratio;
  5. resident-memory growth per configuration (each in a fresh process with --isolate);
  6. greedy identity: every SD output at temperature 0 must equal plain decoding token for token.
Writes results.json, results.md and speedup.png to --out; progress goes to stderr, one line per cell.

  python -m tlt.eval.bench.sd.cli --target runs/quickstart/model --eagle runs/quickstart/drafter \
      --small-lm runs/small-lm --out runs/bench-sd

Exit status: 0; 1 when a greedy SD output differs from plain decoding; 2 on bad arguments or inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from tlt.eval.bench.sd.costs import ForwardCost, measure_costs
from tlt.eval.bench.sd.render import markdown, plot_speedup
from tlt.eval.bench.sd.report import best_rows, peer_rows, sd_rows
from tlt.eval.bench.sd.runs import CellResult, Workload, load_workload, measure_cell, measure_cells
from tlt.eval.bench.sd.settings import HF_ASSISTANT, BenchSettings, Cell, plan_cells
from tlt.files import atomic_write_json, write_report
from tlt.machine import describe_machine
from tlt.speculative.strategy import SpecStrategy

ROOT = Path(__file__).resolve().parents[1]


def _threads() -> None:
    """One torch thread: two threads on two cores collapse under any other load (DESIGN.md)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


CONFIG_HELP = (
    "YAML run config whose data section picks the held-out problems (default: the data section of "
    "<target>/../card.json when present, else the defaults)"
)
HF_HELP = "plain HF generate at these batch sizes (and 1); '' skips every HF peer"
MIN_PROMPTS_HELP = "prompts per cell at least: batch b runs ceil(min_prompts / b) batches of b distinct prompts"
STOP_HELP = (
    "stop rows at EOS (the batch then shrinks); by default rows run to --max-new-tokens, so the batch size stays fixed"
)


def build_parser() -> argparse.ArgumentParser:
    d = BenchSettings(target="", out="")
    p = argparse.ArgumentParser(
        prog="tlt bench rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", required=True, help="target policy HF folder with tokenizer (tlt bootstrap)")
    p.add_argument("--out", required=True, help="results folder (results.json, results.md, speedup.png)")
    p.add_argument("--eagle", help="saved EAGLE drafter folder (tlt train-drafter)")
    p.add_argument("--eagle-int8", action="store_true", help="also run the --eagle drafter drafting in int8")
    p.add_argument("--small-lm", help="saved small_lm drafter folder")
    p.add_argument("--no-ngram", action="store_true", help="skip the n-gram (prompt lookup) drafter")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--batch-sizes", type=_ints, default=d.batch_sizes, help="e.g. 1,2,4,8,16,32,64")
    p.add_argument("--strategies", type=_names, default=d.strategies, help="e.g. 2_1_3,3_1_4,4_1_5,3_2_6")
    p.add_argument("--temperatures", "--temperature", type=_floats, default=d.temperatures, help="e.g. 0,1.0")
    p.add_argument("--hf-batch-sizes", type=_ints, default=d.hf_batch_sizes, help=HF_HELP)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--min-prompts", type=int, default=d.min_prompts, help=MIN_PROMPTS_HELP)
    p.add_argument("--stop-at-eos", action="store_true", help=STOP_HELP)
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed runs per cell; medians are reported")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed runs per cell first")
    p.add_argument("--lookup-tokens", type=int, default=d.lookup_tokens, help="HF prompt_lookup_num_tokens")
    p.add_argument("--cost-reps", type=int, default=d.cost_reps, help="timed forwards per cost-table point")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--isolate", action="store_true", help="run each cell in a fresh subprocess")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. data.seed=1")
    return p


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    fields = {f.name for f in dataclasses.fields(BenchSettings)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    return BenchSettings(**{**values, "ngram": not args.no_ngram, "overrides": tuple(args.overrides)})


def _progress(index: int, total: int, result: CellResult, plain: CellResult | None, elapsed: float) -> None:
    parts = [f"{result.tokens_per_s:.0f} tok/s"]
    if result.cell.is_sd and plain is not None:
        parts.append(f"x{result.tokens_per_s / plain.tokens_per_s:.2f} vs plain")
    if result.accepted_per_verify is not None:
        parts.append(f"A {result.accepted_per_verify + 1:.2f}")
    if result.cell.is_sd and result.cell.temperature == 0 and plain is not None:
        parts.append("identical" if result.outputs == plain.outputs else "DIFFERS FROM PLAIN")
    parts.append(f"{elapsed:.1f} s")
    print(f"[bench_sd] {index}/{total} {result.cell.name}: {', '.join(parts)}", file=sys.stderr, flush=True)


def run_cells(work: Workload, cells: list[Cell], settings: BenchSettings) -> dict[Cell, CellResult]:
    """Measure every cell: in this process round by round (`measure_cells`), or with --isolate each in a fresh
    process, one after another."""
    if not settings.isolate:
        results = measure_cells(work, cells, settings, lambda line: print(f"[bench_sd] {line}", file=sys.stderr))
        for i, result in enumerate(results.values(), 1):  # elapsed: the cell's timed runs
            _progress(i, len(cells), result, results.get(result.cell.plain()), sum(result.seconds))
        return results
    results = {}
    for i, cell in enumerate(cells, 1):
        start = time.perf_counter()
        results[cell] = run_isolated(work, cell, settings)
        _progress(i, len(cells), results[cell], results.get(cell.plain()), time.perf_counter() - start)
    return results


def run_isolated(work: Workload, cell: Cell, settings: BenchSettings) -> CellResult:
    """measure_cell in a fresh `python -m tlt.eval.bench.sd.cli --run-cell SPEC OUT` process (same prompts)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "cell.json", Path(tmp) / "result.json"
        payload = {
            "settings": dataclasses.asdict(settings),
            "cell": dataclasses.asdict(cell),
            "prompts": work.prompts,
            "data": work.data,
        }
        spec.write_text(json.dumps(payload))
        command = [sys.executable, "-m", "tlt.eval.bench.sd.cli", "--run-cell", str(spec), str(out)]
        subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return CellResult.from_dict(json.loads(out.read_text()))


def _run_cell_child(spec_path: str, out_path: str) -> int:
    """The --isolate child: load only what the cell needs, measure it, write the CellResult as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    cell = Cell(**spec["cell"])
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["settings"].items()}
    needed = {cell.drafter, "small_lm" if cell.drafter == HF_ASSISTANT else None}
    settings = dataclasses.replace(
        BenchSettings(**given),
        eagle=given["eagle"] if needed & {"eagle", "eagle_int8"} else None,
        eagle_int8=given["eagle_int8"] and "eagle_int8" in needed,
        small_lm=given["small_lm"] if "small_lm" in needed else None,
        ngram=given["ngram"] and "ngram" in needed,
    )
    work = load_workload(settings, spec["prompts"], spec["data"])
    atomic_write_json(out_path, dataclasses.asdict(measure_cell(work, cell, settings)))
    return 0


def build_payload(
    settings: BenchSettings,
    machine: dict,
    work: Workload,
    results: dict[Cell, CellResult],
    costs: list[ForwardCost],
    cache_len: int,
) -> dict:
    rows = sd_rows(results, costs)
    greedy = [r for r in rows if r.identical is not None]
    failed = [f"{r.drafter}/{r.strategy}/b{r.batch_size}: {r.first_mismatch}" for r in greedy if not r.identical]
    paths = {"eagle": settings.eagle, "small_lm": settings.small_lm, "ngram": "model-free"}
    paths["eagle_int8"] = settings.eagle
    return {
        "machine": machine,
        "settings": dataclasses.asdict(settings),
        "drafters": {kind: paths[kind] for kind in settings.drafters},
        "data": work.data,
        "num_prompts": len(work.prompts),
        "mean_prompt_tokens": statistics.mean(map(len, work.prompts)),
        "cache_len": cache_len,
        "costs": [dataclasses.asdict(c) for c in costs],
        "cells": [_cell_summary(r) for r in results.values()],
        "sd": [dataclasses.asdict(r) for r in rows],
        "best": [dataclasses.asdict(r) for r in best_rows(rows)],
        "peers": [dataclasses.asdict(r) for r in peer_rows(results)],
        "identity": {"ok": not failed, "checked": len(greedy), "failed": failed},
    }


def _cell_summary(result: CellResult) -> dict:
    summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "outputs"}
    derived = {"median_seconds": result.median_seconds, "tokens_per_s": result.tokens_per_s}
    return {"name": result.cell.name, **derived, **summary}


def measure_forward_costs(work: Workload, settings: BenchSettings) -> tuple[list[ForwardCost], int]:
    """t(b, N) for N = 1 and every strategy's verify_tokens, on a cache of prompt + half the response."""
    cache_len = round(statistics.mean(map(len, work.prompts))) + settings.max_new_tokens // 2
    widths = [1] + [SpecStrategy.parse(s).verify_tokens for s in settings.strategies]
    sizes = sorted({*settings.batch_sizes, 1})
    return measure_costs(work.model, sizes, widths, cache_len, settings.cost_reps), cache_len


def benchmark(settings: BenchSettings, work: Workload) -> dict:
    """Run every measurement of `settings` on `work`; returns the results payload (also written to --out)."""
    machine = describe_machine()
    cells = plan_cells(settings)
    runs = settings.warmup + settings.repeats
    print(f"[bench_sd] {len(cells)} cells, {runs} runs each", file=sys.stderr, flush=True)
    results = run_cells(work, cells, settings)
    costs, cache_len = measure_forward_costs(work, settings)
    machine["load_average_end"] = list(os.getloadavg())
    payload = build_payload(settings, machine, work, results, costs, cache_len)
    write_report(Path(settings.out) / "results.md", payload, markdown)
    plot_speedup(payload, Path(settings.out) / "speedup.png")
    return payload


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    _threads()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # stderr is for one progress line per cell
    if argv[:1] == ["--run-cell"]:
        return _run_cell_child(*argv[1:3])
    try:
        settings = settings_from_args(build_parser().parse_args(argv))
        work = load_workload(settings)
    except (ValueError, FileNotFoundError) as err:
        print(f"bench_sd: error: {err}", file=sys.stderr)
        return 2
    identity = benchmark(settings, work)["identity"]
    verdict = "OK" if identity["ok"] else f"FAILED: {'; '.join(identity['failed'])}"
    print(f"[bench_sd] greedy identity {verdict}; results in {settings.out}", file=sys.stderr)
    return 0 if identity["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

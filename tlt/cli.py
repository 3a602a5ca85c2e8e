"""The `tlt` command: bootstrap, evaluate, train-drafter, export-drafter, train, bench, sweep, parity."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tlt.files import DamagedFileError, read_json  # standard library only: no torch at import


def _threads() -> None:
    """One torch thread per process: two threads on two cores collapse under any other load. (And no per-file
    progress bars from transformers' loaders, in this process or the ranks it starts: tlt prints its own.)"""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _error(command: str, message: object, code: int = 2) -> int:
    """Print `tlt COMMAND: error: MESSAGE` to stderr; returns the exit code."""
    print(f"tlt {command}: error: {message}", file=sys.stderr)
    return code


def _config(args: argparse.Namespace, extra: list[str], base: list[str] | tuple[str, ...] = ()):
    from tlt.config import load_config

    return load_config(args.config, extra, base)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from tlt.models.presets import BOOTSTRAP_DEFAULTS
    from tlt.training.bootstrap import bootstrap_folder, run_bootstrap

    chosen = [f"model.preset={args.preset}"] if args.preset else []
    cfg = _config(args, chosen + args.overrides, BOOTSTRAP_DEFAULTS.get(args.preset, ()))
    if args.output_dir:
        cfg.output_dir, cfg.model.path = args.output_dir, None
    elif cfg.output_dir == "runs/default" and cfg.model.path is None:
        cfg.output_dir = f"runs/bootstrap-{cfg.model.preset}"
    folder = bootstrap_folder(cfg)
    card_path = folder / "card.json"
    if card_path.is_file() and not args.force:
        card = read_json(card_path)
        print(f"[tlt] {folder} already holds a bootstrapped model (card.json); use --force to redo it")
    else:
        card = run_bootstrap(cfg)
    if card:
        print(json.dumps({k: card[k] for k in ("preset", "parameters", "heldout", "seconds")}, indent=2))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.eval.heldout import evaluate
    from tlt.files import atomic_write_json
    from tlt.models.io import load_hf_folder

    cfg = _config(args, args.overrides)
    model, tokenizer = load_hf_folder(args.model)
    problems = heldout_problems(task_mix(cfg.data), args.n or cfg.data.heldout_size, cfg.data.seed)
    try:
        report = evaluate(
            model,
            tokenizer,
            problems,
            cfg.eval.max_new_tokens,
            cfg.eval.batch_size,
            temperature=args.temperature,
            samples=args.samples,
            seed=args.seed,
        )
    except ValueError as err:
        return _error("evaluate", err)
    print(f"[tlt] {args.model}: {report.summary()}")
    if args.report:
        atomic_write_json(args.report, report.to_dict())
    return 0


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from tlt.training.drafter.distill import run_train_drafter

    cfg = _config(args, args.overrides)
    out = Path(args.output) if args.output else Path(args.model).parent / "drafter"
    report = run_train_drafter(cfg, args.model, out, progress=not args.quiet)
    print(f"[tlt] {cfg.drafter.kind} drafter saved to {out}")
    print(json.dumps(asdict(report), indent=2))
    return 0


def cmd_export_drafter(args: argparse.Namespace) -> int:
    from tlt.drafters import load_drafter
    from tlt.drafters.export import export_eagle

    drafter = load_drafter(args.drafter)
    if drafter.kind != "eagle":
        return _error("export-drafter", f"{args.drafter} holds a {drafter.kind} drafter; only EAGLE heads export")
    path = export_eagle(drafter, args.output, engine=args.engine)
    loader = {
        "vllm": f'speculative_config={{"method": "eagle", "model": "{path}", "num_speculative_tokens": K}}',
        "sglang": f"--speculative-algorithm EAGLE --speculative-draft-model-path {path}",
    }[args.engine]
    print(f"[tlt] EAGLE-1 folder for {args.engine} written to {path}; load it with {loader}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from tlt.training.train import run_train

    chosen = [f"output_dir={args.output_dir}"] if args.output_dir else []
    summary = run_train(_config(args, args.overrides + chosen))
    if summary is not None:  # None: a rank other than 0 of a torchrun job
        print(json.dumps(summary, indent=2))
    return 0


BENCHES = {
    "rollout": "tlt.eval.bench.sd.cli",  # SD speed: native vs HF generate, per drafter / strategy / batch size
    "adaptive": "tlt.eval.bench.adaptive",  # the strategy tuners side by side on a long-tail rollout workload
    "packing": "tlt.eval.bench.packing",  # drafter-training throughput, packed vs padded
}


def cmd_bench(args: argparse.Namespace) -> int:
    """`tlt bench e2e CONFIG`: the run and the same run with TLT off, compared; the others run a benchmark of
    tlt.eval.bench with the rest of the command line."""
    if args.kind == "e2e":
        if not args.rest or "=" in args.rest[0]:
            return _error("bench e2e", "give a config file first: tlt bench e2e configs/tlt.yaml")
        from tlt.training.train import run_train

        args.config = args.rest[0]
        cfg = _config(args, [*args.rest[1:], "train.compare_baseline=true"])
        run_train(cfg)
        return 0
    import importlib

    return importlib.import_module(BENCHES[args.kind]).main(args.rest)


def cmd_sweep(args: argparse.Namespace) -> int:
    from tlt.eval.sweep import run_sweep
    from tlt.eval.sweep_grid import load_grid

    grid = load_grid(args.grid, args.output_dir, args.overrides)
    rows = run_sweep(grid, dry_run=args.dry_run)
    failed = [row["cell"] for row in rows if row["status"] == "failed"]
    if not args.dry_run:
        print(f"[tlt] sweep results: {grid.output_dir / 'sweep.md'} (and sweep.csv, sweep.png)")
    if failed:
        return _error("sweep", f"{len(failed)} cell(s) failed: {', '.join(failed)}", code=1)
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    from tlt.eval.parity import ParitySettings, run_parity
    from tlt.eval.parity_report import write_report

    model_b, overrides = args.model_b, args.overrides
    if model_b is not None and "=" in model_b and not Path(model_b).exists():  # argparse's pick for `A k=v`
        model_b, overrides = None, [model_b, *overrides]
    cfg = _config(args, overrides)
    try:
        settings = ParitySettings(
            model_a=args.model_a,
            model_b=model_b,
            sd_only=args.sd_only,
            tasks=tuple(t for t in (args.tasks or "").split(",") if t),
            data=args.data,
            n=args.n,
            sd=args.sd,
            drafter=args.drafter,
            strategy=args.strategy,
            alpha=args.alpha,
            out=args.out,
            max_new_tokens=args.max_new_tokens or cfg.eval.max_new_tokens,
            batch_size=args.batch_size or cfg.eval.batch_size,
        )
        report = run_parity(settings, cfg.data)
    except (ValueError, ImportError) as err:
        return _error("parity", err)
    json_path, md_path = write_report(report, args.out)
    identical = report.compared_outputs - len(report.mismatches)
    print(f"[tlt] parity report: {md_path} and {json_path}")
    print(
        f"[tlt] {'differs' if report.differs else 'no significant difference'} at alpha={settings.alpha:g}; "
        f"identical outputs {identical}/{report.compared_outputs}"
    )
    if report.failed:
        return _error("parity", f"SD on changed {len(report.mismatches)} greedy outputs", code=1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `tlt` parser and its subcommand parsers by name."""
    parser = argparse.ArgumentParser(prog="tlt", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the traceback of an error, not one line")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser
    sub.add_parser = lambda *a, **k: add_parser(*a, parents=[common], **k)  # every command takes --debug

    p = sub.add_parser("bootstrap", help="SFT a tiny base policy on generated math solutions")
    p.add_argument(
        "--preset",
        help="model preset: test, tiny, small, deep, with its bootstrap defaults "
        "(tlt.models.presets.BOOTSTRAP_DEFAULTS), "
        "under --config and key=value overrides (default: the config's model.preset)",
    )
    p.add_argument("--config", help="YAML config file (see configs/)")
    p.add_argument("--output-dir", help="run folder (default runs/bootstrap-<preset>)")
    p.add_argument("--force", action="store_true", help="redo the run even if card.json exists")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. bootstrap.max_steps=200")
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("export-drafter", help="write a saved EAGLE drafter as the EAGLE-1 folder vLLM or SGLang loads")
    p.add_argument("drafter", help="a saved tlt EAGLE drafter folder (tlt train-drafter, or a run's checkpoint)")
    p.add_argument("output", help="the folder to write")
    p.add_argument("--engine", choices=("vllm", "sglang"), default="vllm", help="whose EAGLE-1 layout (default vllm)")
    p.set_defaults(func=cmd_export_drafter)

    p = sub.add_parser(
        "evaluate", help="held-out accuracy (greedy, or avg@k when sampled) and response-length percentiles"
    )
    p.add_argument("model", help="HF model folder (e.g. runs/bootstrap-tiny/model)")
    p.add_argument("--config", help="YAML config file; its data section defines the held-out set")
    p.add_argument("--n", type=int, help="number of held-out problems (default data.heldout_size)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sampled")
    p.add_argument("--samples", type=int, default=1, help="sampled responses per problem to average (needs T > 0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--report", help="also write the report as JSON here")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "train-drafter",
        help="distil an EAGLE (default) or, with drafter.kind=small_lm, a small-LM drafter on the target's own "
        "generations",
    )
    p.add_argument("model", help="target HF model folder (e.g. runs/bootstrap-tiny/model)")
    p.add_argument("--output", help="drafter folder to write (default: <model>/../drafter)")
    p.add_argument("--config", help="YAML config file (its drafter and data sections are used)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. drafter.train_steps=100")
    p.set_defaults(func=cmd_train_drafter)

    p = sub.add_parser("train", help="GRPO RL of a bootstrapped policy with TLT rollouts (resumable)")
    p.add_argument(
        "config",
        help="YAML config file (configs/tlt.yaml, configs/baseline.yaml); model.path is the starting policy",
    )
    p.add_argument(
        "--output-dir", help="run folder (default: the config's output_dir); one with a checkpoint is resumed"
    )
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. grpo.steps=50")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "bench",
        help="speed reports measured side by side: e2e (TLT vs the same run with TLT off), rollout, adaptive, packing",
        description="e2e CONFIG [key=value ...]: `tlt train` with train.compare_baseline=true (step and rollout "
        "ratios, rollout share, Amdahl bound, held-out accuracy, machine) in <output_dir>/speedup.md. rollout / "
        "adaptive / packing: the benchmarks (tlt.eval.bench.sd.cli, tlt.eval.bench.adaptive, tlt.eval.bench.packing) "
        "with their own arguments (`tlt bench rollout --help`).",
    )
    p.add_argument("kind", choices=("e2e", *BENCHES), help="which report")
    p.add_argument("rest", nargs="*", help="e2e: CONFIG [key=value ...]; others: their arguments")
    p.set_defaults(func=cmd_bench, config=None)

    p = sub.add_parser("sweep", help="run a grid of `tlt train` cells (ablations) and tabulate them (resumable)")
    p.add_argument("grid", help="grid YAML file (e.g. configs/ablation.yaml; format: tlt/eval/sweep_grid.py)")
    p.add_argument("--output-dir", help="sweep folder (default: the grid's output_dir); cells go in <dir>/<cell>/")
    p.add_argument("--dry-run", action="store_true", help="validate every cell and list the plan; run nothing")
    p.add_argument("overrides", nargs="*", help="key=value config overrides applied to every cell")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("parity", help="two models, or SD off vs on, on the same lm-eval tasks (needs tlt[eval])")
    p.add_argument("model_a", help="HF model folder (side A)")
    p.add_argument("model_b", nargs="?", help="HF model folder (side B); omit with --sd-only")
    p.add_argument("--sd-only", action="store_true", help="compare model_a with SD off (A) and on (B)")
    p.add_argument("--tasks", help="comma-separated: tlt_gsm8k_local, tlt_math_local (default: the data's format)")
    p.add_argument("--data", help="GSM8K- or MATH-format JSONL (default: the config's held-out set)")
    p.add_argument("--n", type=int, help="problems per task (default: all of --data, or data.heldout_size)")
    p.add_argument("--sd", choices=("on", "off"), default="off", help="SD for both models (two-model runs)")
    p.add_argument("--drafter", default="ngram", help="drafter folder or 'ngram', where SD is on")
    p.add_argument("--strategy", default="4_1_5", help="SD strategy steps_topk_verifytokens")
    p.add_argument("--max-new-tokens", type=int, help="default eval.max_new_tokens")
    p.add_argument("--batch-size", type=int, help="default eval.batch_size")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the McNemar tests")
    p.add_argument("--out", default="runs/parity", help="folder for parity.md, parity.json, data and task files")
    p.add_argument("--config", help="YAML config file; its data and eval sections give the defaults")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    p.set_defaults(func=cmd_parity)
    return parser, sub.choices


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse like `parse_intermixed_args`, so key=value overrides may come before or after options.

    argparse refuses intermixed parsing on a parser with subcommands (Python 3.11), so the chosen
    subcommand's own parser does it; usage errors, `--help` and unknown commands go through the top parser.
    """
    parser, commands = _build()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in commands:
        return parser.parse_args(argv)
    if argv[0] == "bench" and len(argv) > 1 and argv[1] in ("e2e", *BENCHES):  # the rest is the bench's own
        debug, rest = "--debug" in argv[2:], [a for a in argv[2:] if a != "--debug"]
        return argparse.Namespace(command="bench", func=cmd_bench, kind=argv[1], rest=rest, config=None, debug=debug)
    args = commands[argv[0]].parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _threads()
    from tlt.assets import AssetError
    from tlt.config import ConfigError
    from tlt.data.jsonl import DataError

    # ImportError: an optional extra that is not installed
    one_line = (ConfigError, DataError, AssetError, DamagedFileError, FileNotFoundError, ImportError)
    try:
        return args.func(args)
    except one_line as err:
        if getattr(args, "debug", False):
            raise
        return _error(args.command, f"{err} (--debug shows the traceback)")


if __name__ == "__main__":
    sys.exit(main())

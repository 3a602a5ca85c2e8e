"""Per-epoch report of a multi-epoch sweep over a fixed prompt pool (`tlt sweep configs/suffix_epochs.yaml`, or
`configs/composed_epochs.yaml`).

Reads each cell's per-step metrics (`<cell>/checkpoint/metrics.json`) and tabulates, per epoch of the fixed prompt
pool (steps_per_epoch = data.train_size / rollout.prompts_per_step), the summed rollout seconds, the tokens per
verify (accepted + 1, mean over the epoch's steps that decoded speculatively) and the share of tokens decoded
speculatively, with each cell's rollout speedup over the first cell in the same epoch; for a composed drafter
(drafter.kind=eagle+suffix) also the suffix part's share of the SD rows and the tokens per verify on each part's
rows. Writes epochs.json (the raw data it read) and epochs.md.

  python -m eval.suffix_epochs runs/suffix-epochs --out eval/results/suffix_epochs_deep_v1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tlt.config import load_config
from tlt.files import write_report
from tlt.machine import describe_machine
from tlt.training.run_log import part_tokens_per_verify

KEYS = ("step", "rollout_seconds", "accept_length", "sd_token_share", "response_len_mean")
PARTS = ("learned_verifies", "learned_accepted", "suffix_verifies", "suffix_accepted")  # composed drafters only


def read_sweep(sweep: Path) -> dict:
    """{cell: {"steps_per_epoch", "metrics": [...]}} in sweep.csv order."""
    order = [line.split(",")[0] for line in (sweep / "sweep.csv").read_text().splitlines()[1:]]
    cells = {}
    for name in order:
        cfg = load_config(sweep / name / "config.yaml", [])
        metrics = json.loads((sweep / name / "checkpoint" / "metrics.json").read_text())
        per_epoch = max(cfg.data.train_size // cfg.rollout.prompts_per_step, 1)
        keys = KEYS + tuple(k for k in PARTS if k in metrics[0])
        cells[name] = {"steps_per_epoch": per_epoch, "metrics": [{k: m[k] for k in keys} for m in metrics]}
    return cells


def epochs(cell: dict) -> list[dict]:
    per = cell["steps_per_epoch"]
    groups: dict[int, list[dict]] = {}
    for m in cell["metrics"]:
        groups.setdefault(m["step"] // per, []).append(m)
    return [
        {
            "epoch": e + 1,
            "rollout_seconds": sum(m["rollout_seconds"] for m in ms),
            "accept_length": statistics.fmean([m["accept_length"] for m in ms if m["accept_length"] > 0] or [0.0]),
            "sd_token_share": statistics.fmean(m["sd_token_share"] for m in ms),
            **{k: sum(m.get(k, 0) for m in ms) for k in PARTS},
        }
        for e, ms in sorted(groups.items())
    ]


def _parts(e: dict) -> str:
    """'suffix share of SD rows; tokens per verify on suffix, learned rows', or '-' without a composed drafter."""
    rows = e["suffix_verifies"] + e["learned_verifies"]
    if not rows:
        return "-"
    per = [part_tokens_per_verify(e, part) for part in ("suffix", "learned")]
    return f"{e['suffix_verifies'] / rows:.1%}; {per[0]:.2f}, {per[1]:.2f}"


def table(data: dict) -> str:
    cells = data["cells"]
    names = list(cells)
    base = {e["epoch"]: e["rollout_seconds"] for e in epochs(cells[names[0]])}
    lines = [
        "# Suffix drafter over epochs of a fixed prompt pool",
        "",
        f"The sweep in `{Path(data['sweep']).name}` (its config says how the cells ran), then "
        f"`python -m eval.suffix_epochs`; machine {data['machine'].get('cpu_model')}. Per epoch: summed rollout "
        f"seconds, mean tokens per verify (accepted + 1, over its steps with SD) and SD share of tokens, and the "
        f"rollout speedup over `{names[0]}` in the same epoch; a composed drafter's suffix share of the SD rows and "
        "tokens per verify on the suffix and the learned rows.",
        "",
        "| cell | epoch | rollout s | tokens per verify | SD share | rollout speedup | "
        "suffix share; per verify: suffix, learned |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for e in epochs(cells[name]):
            speedup = base[e["epoch"]] / e["rollout_seconds"]
            lines.append(
                f"| {name} | {e['epoch']} | {e['rollout_seconds']:.1f} | {e['accept_length']:.2f} | "
                f"{e['sd_token_share']:.0%} | {speedup:.2f}x | {_parts(e)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", nargs="?", help="the sweep's output folder")
    parser.add_argument("--out", required=True, help="folder for epochs.json and epochs.md")
    parser.add_argument("--render", action="store_true", help="rewrite epochs.md from the epochs.json in --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        if not (out / "epochs.json").is_file():
            parser.error(f"--render: no epochs.json in {out}")
        data = json.loads((out / "epochs.json").read_text())
    elif args.sweep is None:
        parser.error("give the sweep's output folder, or --render")
    else:
        data = {"machine": describe_machine(), "sweep": args.sweep, "cells": read_sweep(Path(args.sweep))}
    print(write_report(out / "epochs.md", data, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-epoch report of a multi-epoch sweep over a fixed prompt pool (`tlt sweep configs/suffix_epochs.yaml`, or
`configs/composed_epochs.yaml`).

Reads each cell's per-step metrics (`<cell>/checkpoint/metrics.json`) and tabulates, per epoch of the fixed prompt
pool (steps_per_epoch = data.train_size / rollout.prompts_per_step), the summed rollout seconds, the tokens per
verify (accepted + 1, mean over the epoch's steps that decoded speculatively) and the share of tokens decoded
speculatively, with each cell's rollout speedup over the first cell in the same epoch; for a composed drafter
(drafter.kind=eagle+suffix) also the suffix part's share of the SD rows and the tokens per verify on each part's
rows. Given several sweeps of the same grid (seeds), one such table each, then the later epochs (2 on, where
the history has seen every prompt) summed per sweep: each cell's rollout seconds and speedup over the first cell,
with the median and range over the sweeps. Writes epochs.json (the raw data it read) and epochs.md.

  python -m eval.suffix_epochs runs/suffix-epochs --out eval/results/suffix_epochs_deep_v1
  python -m eval.suffix_epochs runs/suffix-epochs-tiny runs/suffix-epochs-tiny-seed1 ... --out DIR
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
            "response_len_sum": sum(m["response_len_mean"] for m in ms),  # x rows per step: the epoch's tokens
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


def _sweeps(data: dict) -> list[dict]:
    """[{"sweep", "cells", "order"?}] of a report (one written before several sweeps were read has them at the
    top)."""
    return data.get("sweeps") or [{"sweep": data["sweep"], "cells": data["cells"], "order": data.get("order")}]


def cell_order(sweep: dict) -> list[str]:
    """The cells in sweep.csv order, the first being the base the others are compared with. Reports keep it as
    `order`, since their JSON sorts keys; one written before that takes the keys' order."""
    return sweep.get("order") or list(sweep["cells"])


def table(data: dict) -> str:
    sweeps = _sweeps(data)
    names = cell_order(sweeps[0])
    folders = ", ".join(f"`{Path(sweep['sweep']).name}`" for sweep in sweeps)
    which = f"The sweep in {folders} (its config" if len(sweeps) == 1 else f"The sweeps in {folders} (their config"
    lines = [
        "# Suffix drafter over epochs of a fixed prompt pool",
        "",
        f"{which} says how the cells ran), then "
        f"`python -m eval.suffix_epochs`; machine {data['machine'].get('cpu_model')}. Per epoch: summed rollout "
        f"seconds, mean tokens per verify (accepted + 1, over its steps with SD) and SD share of tokens, and the "
        f"rollout speedup over `{names[0]}` in the same epoch; a composed drafter's suffix share of the SD rows and "
        "tokens per verify on the suffix and the learned rows.",
    ]
    for sweep in sweeps:
        if len(sweeps) > 1:
            lines += ["", f"## {Path(sweep['sweep']).name}"]
        lines += [""] + _epoch_rows(sweep["cells"], cell_order(sweep))
    if len(sweeps) > 1 and _has_later_epochs(sweeps[0]):  # a pool larger than the run has one epoch only
        lines += [
            "",
            f"## Epochs 2 on, per sweep: rollout seconds and speedup over `{names[0]}`",
            "",
            "Rollout tokens/s (response tokens per rollout second) over the base's leaves out that the cells sample "
            "responses of different lengths; an epoch's seconds still follow its longest response.",
            "",
        ]
        lines += _later_rows(sweeps, names)
    return "\n".join(lines) + "\n"


def _has_later_epochs(sweep: dict) -> bool:
    return any(e["epoch"] > 1 for cell in sweep["cells"].values() for e in epochs(cell))


def _later_rows(sweeps: list[dict], names: list[str]) -> list[str]:
    def later(name: str, key: str) -> list[float]:
        return [sum(e[key] for e in epochs(s["cells"][name]) if e["epoch"] > 1) for s in sweeps]

    seconds = {name: later(name, "rollout_seconds") for name in names}
    tokens = {name: later(name, "response_len_sum") for name in names}
    header = ", ".join(Path(s["sweep"]).name for s in sweeps)
    lines = [
        f"| cell | rollout s ({header}) | speedup (same order) | speedup median (min-max) | rollout tokens/s "
        "speedup (same order) | its median (min-max) |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        ratios = [b / x for b, x in zip(seconds[names[0]], seconds[name], strict=True)]
        rates = [
            r * t / bt for r, t, bt in zip(ratios, tokens[name], tokens[names[0]], strict=True)
        ]  # tokens/s over the base's: the rows per step are the same in every cell
        lines.append(
            f"| {name} | {', '.join(f'{x:.1f}' for x in seconds[name])} | {_listed(ratios)} | "
            f"{_median_range(ratios)} | {_listed(rates)} | {_median_range(rates)} |"
        )
    return lines


def _listed(ratios: list[float]) -> str:
    return ", ".join(f"{r:.2f}x" for r in ratios)


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def _epoch_rows(cells: dict, names: list[str]) -> list[str]:
    base = {e["epoch"]: e["rollout_seconds"] for e in epochs(cells[names[0]])}
    lines = [
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
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="*", help="the sweep's output folder (several: the same grid's seeds)")
    parser.add_argument("--out", required=True, help="folder for epochs.json and epochs.md")
    parser.add_argument("--render", action="store_true", help="rewrite epochs.md from the epochs.json in --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        if not (out / "epochs.json").is_file():
            parser.error(f"--render: no epochs.json in {out}")
        data = json.loads((out / "epochs.json").read_text())
    elif not args.sweeps:
        parser.error("give the sweep's output folder, or --render")
    elif len(args.sweeps) == 1:
        cells = read_sweep(Path(args.sweeps[0]))
        data = {"machine": describe_machine(), "sweep": args.sweeps[0], "cells": cells, "order": list(cells)}
    else:
        sweeps = [{"sweep": s, "cells": (cells := read_sweep(Path(s))), "order": list(cells)} for s in args.sweeps]
        data = {"machine": describe_machine(), "sweeps": sweeps}
    print(write_report(out / "epochs.md", data, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

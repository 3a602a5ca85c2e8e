"""`tlt sweep GRID.yaml`: run a grid of `tlt train` cells (ablations) and tabulate their summaries.

The grid file's format: tlt.eval.sweep_grid. Every cell's config is built and validated before anything runs: a
bad key in any cell stops the whole sweep naming that cell. A cell whose folder holds the summary.json of all its
steps is skipped (so a sweep resumes; a cell with a checkpoint resumes training, as `tlt train` does); a cell that
raises is recorded with its error and the sweep goes on. After every cell `<output_dir>/sweep.csv`, `sweep.md`
and `sweep.png` (step time per cell) are rewritten atomically; `machine.json` records the machine the sweep (last)
started on, and sweep.md names it (CPU models vary between machines of one name). With `turn_steps` the cells
take turns: steps 1..N of every cell, then N+1..2N of every cell (each turn resuming the cell's checkpoint), and
so on, so a machine's speed drift during the sweep slows every cell alike instead of the later ones.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

from tlt.config import ConfigError, RunConfig, load_config
from tlt.eval.sweep_grid import Cell, Grid
from tlt.files import atomic_save_figure, atomic_write_json, atomic_write_text, read_json, subplots
from tlt.machine import describe_machine, machine_name

SUMMARY_FIELDS = (
    "devices",
    "reward_last",
    "accuracy_last",
    "accept_length_mean",
    "sd_token_share_mean",
    "step_seconds_mean",
    "response_tokens",
    "seconds.rollout",
    "seconds.train",
    "seconds.drafter",
    "seconds.push",
    "seconds.total",
    "spot_steps",
    "idle_train_seconds",
)
COLUMNS = ("cell", "status", "overrides", "idle_workers", *SUMMARY_FIELDS, "error")

Runner = Callable[[RunConfig], dict | None]


def cell_config(grid: Grid, cell: Cell) -> RunConfig:
    """The cell's validated run config (output_dir set to its folder); ConfigError names the cell."""
    from tlt.training.rl_loop import check_rl_config

    try:
        overrides = [*grid.overrides, *cell.overrides, f"output_dir={grid.cell_dir(cell)}"]
        cfg = load_config(cell.base or grid.base, overrides)
        check_rl_config(cfg)
        online = cfg.speculative.enabled and cfg.scheduler.policy != "never"
        learned = cfg.drafter.kind.split("+")[0]  # a composed drafter trains its learned part
        if online and not cfg.drafter.path and learned != "eagle":  # RLTrainer's check, made up front
            raise ConfigError(
                f"scheduler.policy: online drafter training needs an EAGLE drafter, got {cfg.drafter.kind!r}; "
                "set scheduler.policy=never to keep it frozen"
            )
    except ConfigError as err:
        raise ConfigError(f"{grid.path}: sweep cell {cell.name!r}: {err}") from None
    return cfg


def validate(grid: Grid) -> dict[str, RunConfig]:
    """Every cell's config, or ConfigError for the first bad cell."""
    return {cell.name: cell_config(grid, cell) for cell in grid.cells}


def flatten_summary(summary: dict) -> dict:
    """A run's summary.json as a sweep row's fields (`SUMMARY_FIELDS`, seconds as seconds.<part>, idle_workers)."""
    flat = {k: summary.get(k) for k in SUMMARY_FIELDS if "." not in k}
    flat["idle_workers"] = _idle_workers(summary)
    flat |= {f"seconds.{k}": v for k, v in (summary.get("seconds") or {}).items() if f"seconds.{k}" in SUMMARY_FIELDS}
    return flat


def _idle_workers(summary: dict) -> str:
    """Whether the cell's drafter could train in idle time: only with several processes, where a rank whose
    rollout share is done waits for the others (one process: `spot` trains within scheduler.no_idle_budget)."""
    devices = summary.get("devices") or 1
    return f"yes ({devices} ranks)" if devices > 1 else "no (1 process)"


def _read_summary(folder: Path) -> dict | None:
    path = folder / "summary.json"
    return read_json(path) if path.is_file() else None


def _finished(folder: Path, cfg: RunConfig) -> dict | None:
    """The summary of a cell that ran all its steps (a turn's summary counts fewer), else None."""
    summary = _read_summary(folder)
    return summary if summary is not None and summary.get("steps", 0) >= cfg.grpo.steps else None


def _default_runner(cfg: RunConfig) -> dict | None:
    from tlt.training.train import run_train

    return run_train(cfg)


def run_sweep(
    grid: Grid,
    runner: Runner | None = None,
    dry_run: bool = False,
    check_paths: bool = True,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Validate every cell, then run (or with `dry_run` only list) them; returns one result row per cell.

    `runner` trains one cell's config (default `run_train`); `check_paths` also requires every cell's
    model.path and drafter.path up front (a dry run only warns)."""
    configs = validate(grid)
    if check_paths:
        from tlt.training.train import check_start_paths

        paths = {}
        for name, cfg in configs.items():  # one check (and warning) per distinct model.path / drafter.path
            paths.setdefault((cfg.model.path, cfg.speculative.enabled and cfg.drafter.path), (name, cfg))
        for name, cfg in paths.values():
            try:
                check_start_paths(cfg)
            except (ConfigError, FileNotFoundError) as err:
                if not dry_run:
                    raise ConfigError(f"sweep cell {name!r}: {err}") from None
                log(f"[tlt sweep] warning: cell {name!r}: {err}")
    runner = runner or _default_runner
    rows = {cell.name: {"cell": cell.name, "overrides": " ".join(cell.overrides), "error": ""} for cell in grid.cells}
    todo = []
    for cell in grid.cells:
        done = _finished(grid.cell_dir(cell), configs[cell.name])
        if done is not None:
            rows[cell.name] |= {"status": "skipped"} | flatten_summary(done)
        elif dry_run:
            rows[cell.name]["status"] = "planned"
        else:
            todo.append(cell)
        if dry_run:
            log(f"[tlt sweep] {rows[cell.name]['status']:8} {cell.name}: {rows[cell.name]['overrides'] or '(base)'}")
    if todo:
        atomic_write_json(Path(grid.output_dir) / "machine.json", describe_machine())
    ends = {cell.name: _turn_ends(configs[cell.name], grid.turn_steps) for cell in todo}
    for turn in range(max(map(len, ends.values()), default=0)):
        for cell in todo:
            if turn < len(ends[cell.name]) and rows[cell.name].get("status") != "failed":
                rows[cell.name] |= _run_cell(grid, cell, configs[cell.name], ends[cell.name][turn], runner, log)
                write_results(list(rows.values()), grid.output_dir, grid.turn_steps)
    if not dry_run:
        write_results(list(rows.values()), grid.output_dir, grid.turn_steps)
    return list(rows.values())


def _turn_ends(cfg: RunConfig, turn_steps: int) -> list[int]:
    """The steps after which a cell stops in each turn (one turn when turn_steps is 0)."""
    steps = cfg.grpo.steps
    return [*range(turn_steps, steps, turn_steps), steps] if turn_steps else [steps]


def _run_cell(grid: Grid, cell: Cell, cfg: RunConfig, end: int, runner: Runner, log) -> dict:
    """Train the cell up to step `end` (resuming its checkpoint); its row's status and summary fields."""
    folder = grid.cell_dir(cell)
    log(f"[tlt sweep] cell {grid.cells.index(cell) + 1}/{len(grid.cells)}: {cell.name} to step {end} -> {folder}")
    try:
        summary = runner(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, stop_after=end)))
    except Exception as err:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on
        log(f"[tlt sweep] cell {cell.name} failed: {type(err).__name__}: {err}")
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    status = "done" if end == cfg.grpo.steps else f"to step {end}"
    return {"status": status} | flatten_summary(_read_summary(folder) or summary or {})


def _fmt(v: object) -> str:
    """Plain decimals: 3 places (seconds, rewards, rates), never scientific notation."""
    if v is None:
        return ""
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in COLUMNS} for row in rows)
    return buf.getvalue()


def speedups(rows: list[dict]) -> list[dict]:
    """Per row, the first row's summed rollout and total seconds over this row's (None where either is missing):
    how much faster than the grid's first cell, its reference, a cell ran; and its rollout throughput (response
    tokens per rollout second) over the first row's, which leaves out that cells sample responses of different
    lengths."""
    ref = rows[0] if rows else {}

    def ratio(row: dict, key: str) -> float | None:
        return ref[key] / row[key] if ref.get(key) and row.get(key) else None

    def throughput(row: dict) -> float | None:
        tokens = row.get("response_tokens"), ref.get("response_tokens")
        time = ratio(row, "seconds.rollout")
        return time * tokens[0] / tokens[1] if time and all(tokens) else None

    return [
        {
            "rollout_speedup": ratio(r, "seconds.rollout"),
            "rollout_tokens_per_s_speedup": throughput(r),
            "total_speedup": ratio(r, "seconds.total"),
        }
        for r in rows
    ]


def to_markdown(rows: list[dict], turn_steps: int = 0, machine: dict | None = None) -> str:
    """The sweep's table; `machine` (a `describe_machine()` dict) names where it ran."""
    rows = [row | extra for row, extra in zip(rows, speedups(rows), strict=True)]
    cols = [c for c in COLUMNS if c != "overrides"]
    after_total = cols.index("seconds.total") + 1
    cols[after_total:after_total] = ["rollout_speedup", "rollout_tokens_per_s_speedup", "total_speedup"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [_fmt(row.get(c)).replace("|", "\\|").replace("\n", " ") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"rollout_speedup / total_speedup: the first cell's ({rows[0]['cell'] if rows else ''}) summed rollout / "
        f"total seconds over the cell's ({_order(turn_steps)}; sampled responses differ between cells). "
        "rollout_tokens_per_s_speedup: the cell's response tokens per rollout second over the first cell's, which "
        "leaves out that the cells sampled responses of different lengths (a step's rollout still follows its "
        "longest response).",
        "",
        "Seconds are sums over each cell's steps. idle_workers: whether a rank sat idle while another still rolled "
        "out (several processes), where `spot` trains the drafter for free; in one process no worker is ever idle "
        "and `spot` trains only within scheduler.no_idle_budget of each step. spot_steps / idle_train_seconds: the "
        "drafter micro-steps run, and seconds spent, in that idle time.",
        "",
    ]
    if machine:
        threads = machine.get("torch_threads", "?")
        lines += [f"Machine: {machine_name(machine)}, torch threads {threads} per process.", ""]
    lines += [
        "Overrides per cell:",
        "",
    ]
    lines += [f"- `{row['cell']}`: `{row['overrides'] or '(base)'}`" for row in rows]
    return "\n".join(lines) + "\n"


def _order(turn_steps: int) -> str:
    if turn_steps:
        return f"the cells took turns of {turn_steps} steps, so the machine's speed drift slowed them alike"
    return "cells run one after another, not interleaved: the machine's speed may differ between them"


def plot_step_time(rows: list[dict], path: Path) -> None:
    """Bar chart of the mean RL step time per cell (0 where a cell has no summary), written atomically."""
    names = [row["cell"] for row in rows]
    seconds = [row.get("step_seconds_mean") or 0.0 for row in rows]
    fig, ax = subplots(figsize=(max(4.0, 1.2 * len(rows)), 4))
    ax.bar(range(len(rows)), seconds)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set(ylabel="seconds", title="mean RL step time per cell")
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)


def write_results(rows: list[dict], out: Path, turn_steps: int = 0) -> None:
    out = Path(out)
    machine = read_json(out / "machine.json") if (out / "machine.json").exists() else None
    atomic_write_text(out / "sweep.csv", to_csv(rows))
    atomic_write_text(out / "sweep.md", to_markdown(rows, turn_steps, machine))
    plot_step_time(rows, out / "sweep.png")

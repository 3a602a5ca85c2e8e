"""`tlt sweep GRID.yaml`: run a grid of `tlt train` cells (ablations) and tabulate their summaries.

A grid file::

    base: tlt.yaml                 # run config, relative to the grid file
    output_dir: runs/ablation      # each cell trains into <output_dir>/<cell>/
    overrides: [grpo.steps=6]      # optional: key=value applied to every cell
    grid:
      product:                     # optional: the cartesian product of these values
        speculative.tuner: [fixed, cost]
        drafter.kind: [eagle, ngram]
      cells:                       # optional: explicit cells (listed before the product's)
        - name: baseline
          base: baseline.yaml      # optional: this cell's own base config
          overrides: [speculative.enabled=false]

The file is parsed into a typed `GridFile` (a bad key, type or value fails naming the file and the key), then
expanded into the `Grid` of `Cell`s to run. A product cell is named after its key=value pairs as a
filesystem-safe slug (`speculative.tuner=cost,drafter.kind=eagle` ->
`speculative.tuner-cost_drafter.kind-eagle`). Every cell's config is built and validated before anything runs:
a bad key in any cell stops the whole sweep naming that cell. A cell whose folder holds summary.json is
skipped (so a sweep resumes; a cell with a checkpoint but no summary resumes training, as `tlt train` does); a
cell that raises is recorded with its error and the sweep goes on. After every cell `<output_dir>/sweep.csv`,
`sweep.md` and `sweep.png` (step time per cell) are rewritten atomically.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import yaml

from tlt.config import ConfigError, RunConfig, load_config
from tlt.files import atomic_save_figure, atomic_write_text

SUMMARY_FIELDS = (
    "devices",
    "reward_last",
    "accuracy_last",
    "accept_length_mean",
    "sd_token_share_mean",
    "step_seconds_mean",
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


@dataclass(frozen=True)
class CellEntry:
    """One entry of the grid file's `grid.cells`, as written."""

    name: str  # the cell's folder name (slugged)
    base: str | None = None  # this cell's own run config, relative to the grid file; None: the grid's base
    overrides: tuple[str, ...] = ()  # key=value, applied after the grid's overrides

    @classmethod
    def parse(cls, raw: object, key: str) -> CellEntry:
        given = _given(cls, raw, key)
        name = given["name"]
        _expect(isinstance(name, str | int) and slug(str(name)), f"{key}.name", "a name with letters or digits", name)
        return cls(
            slug(str(name)),
            _path(given.get("base"), f"{key}.base"),
            _overrides(given.get("overrides"), f"{key}.overrides"),
        )


@dataclass(frozen=True)
class GridSection:
    """The grid file's `grid:` section: explicit cells, then the cartesian product of the axes."""

    cells: tuple[CellEntry, ...] = ()
    product: dict[str, list] = field(default_factory=dict)  # config key -> the values it takes (non-empty)

    @classmethod
    def parse(cls, raw: object, key: str = "grid") -> GridSection:
        given = _given(cls, raw, key)
        cells, product = given.get("cells", []), given.get("product", {})
        _expect(isinstance(cells, list), f"{key}.cells", "a list of cells (name, base, overrides)", cells)
        _expect(isinstance(product, dict), f"{key}.product", "a mapping config key: [values]", product)
        for axis, values in product.items():
            _expect(isinstance(values, list) and values, f"{key}.product.{axis}", "a non-empty list of values", values)
        if not cells and not product:
            raise ConfigError(f"{key}: no cells; give {key}.cells and/or {key}.product")
        return cls(tuple(CellEntry.parse(c, f"{key}.cells[{i}]") for i, c in enumerate(cells)), product)


@dataclass(frozen=True)
class GridFile:
    """A grid file as written (format in the module docstring); paths are relative to the file."""

    base: str  # the run config every cell starts from
    grid: GridSection
    output_dir: str | None = None  # None: runs/sweep-<grid file name>
    overrides: tuple[str, ...] = ()  # key=value applied to every cell

    @classmethod
    def parse(cls, raw: object) -> GridFile:
        given = _given(cls, raw, "")
        return cls(
            base=_path(given["base"], "base"),
            grid=GridSection.parse(given["grid"]),
            output_dir=_path(given.get("output_dir"), "output_dir"),
            overrides=_overrides(given.get("overrides"), "overrides"),
        )


@dataclass(frozen=True)
class Cell:
    name: str
    overrides: tuple[str, ...]
    base: Path | None = None  # None: the grid's base


@dataclass(frozen=True)
class Grid:
    """The sweep to run: the grid file's cells expanded, paths resolved, command-line options applied."""

    path: Path  # the grid file, named in errors
    base: Path
    output_dir: Path
    overrides: tuple[str, ...]
    cells: tuple[Cell, ...]

    def cell_dir(self, cell: Cell) -> Path:
        return self.output_dir / cell.name


def slug(text: str) -> str:
    """A filesystem-safe, stable name: `a.b=c,d=['3_1_4']` -> `a.b-c_d-3_1_4`."""
    text = text.replace("=", "-").replace(",", "_")
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text)
    text = re.sub(r"[-_]{2,}", lambda m: m.group(0)[0], text).strip("-_.")
    return text


def _value(v: object) -> str:
    """A YAML value as the right-hand side of a key=value override."""
    return v if isinstance(v, str) else json.dumps(v)


def _expect(ok: object, key: str, allowed: str, value: object) -> None:
    if not ok:
        raise ConfigError(f"{key}: got {value!r}; allowed: {allowed}")


def _given(cls: type, raw: object, key: str) -> dict:
    """The keys `raw` gives for the dataclass `cls` (a key left empty counts as absent); ConfigError names an
    unknown or a missing key."""
    names = [f.name for f in fields(cls)]
    _expect(isinstance(raw, dict), key or "the file", "a mapping with keys " + ", ".join(names), raw)
    prefix = f"{key}." if key else ""
    for k in raw:
        if k not in names:
            raise ConfigError(f"{prefix}{k}: unknown key; allowed: {', '.join(names)}")
    given = {k: v for k, v in raw.items() if v is not None}
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING and f.name not in given:
            raise ConfigError(f"{prefix}{f.name}: missing; this key is required")
    return given


def _path(raw: object, key: str) -> str | None:
    _expect(raw is None or (isinstance(raw, str) and raw), key, "a file path (a string)", raw)
    return raw


def _overrides(raw: object, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    strings = isinstance(raw, list) and all(isinstance(o, str) for o in raw)
    _expect(strings, key, "a list of key=value strings", raw)
    bad = [o for o in raw if "=" not in o]
    _expect(not bad, key, "key=value strings (e.g. grpo.steps=6)", bad[0] if bad else None)
    return tuple(raw)


def expand(section: GridSection, root: Path = Path(".")) -> tuple[Cell, ...]:
    """The named cells of a grid file's `grid:` section (explicit cells first, then the product)."""
    cells = [Cell(c.name, c.overrides, root / c.base if c.base else None) for c in section.cells]
    axes = section.product
    for combo in itertools.product(*axes.values()) if axes else ():
        overrides = tuple(f"{k}={_value(v)}" for k, v in zip(axes, combo, strict=True))
        cells.append(Cell(slug(",".join(overrides)), overrides))
    names = [c.name for c in cells]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"grid: cell name(s) {dupes} given more than once; each cell needs its own (its folder)")
    return tuple(cells)


def load_grid(path: str | Path, output_dir: str | Path | None = None, extra: list[str] = ()) -> Grid:
    """Parse a grid file; `output_dir` and `extra` overrides (applied last, to every cell) from the CLI.

    A bad key raises ConfigError naming the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid file not found: {path}")
    try:
        spec = GridFile.parse(yaml.safe_load(path.read_text()) or {})
        cells = expand(spec.grid, path.parent)
    except (ConfigError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: {err}") from None
    out = output_dir or spec.output_dir or f"runs/sweep-{path.stem}"
    overrides = spec.overrides + _overrides(list(extra), "command-line overrides")
    return Grid(path, path.parent / spec.base, Path(out), overrides, cells)


def cell_config(grid: Grid, cell: Cell) -> RunConfig:
    """The cell's validated run config (output_dir set to its folder); ConfigError names the cell."""
    from tlt.training.rl_loop import check_rl_config

    try:
        overrides = [*grid.overrides, *cell.overrides, f"output_dir={grid.cell_dir(cell)}"]
        cfg = load_config(cell.base or grid.base, overrides)
        check_rl_config(cfg)
        online = cfg.speculative.enabled and cfg.scheduler.policy != "never"
        if online and not cfg.drafter.path and cfg.drafter.kind != "eagle":  # RLTrainer's check, made up front
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


def _flatten(summary: dict) -> dict:
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
    return json.loads(path.read_text()) if path.is_file() else None


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
    rows: list[dict] = []
    for i, cell in enumerate(grid.cells, 1):
        folder = grid.cell_dir(cell)
        row = {"cell": cell.name, "overrides": " ".join(cell.overrides), "error": ""}
        done = _read_summary(folder)
        if done is not None:
            row |= {"status": "skipped"} | _flatten(done)
        elif dry_run:
            row["status"] = "planned"
        else:
            log(f"[tlt sweep] cell {i}/{len(grid.cells)}: {cell.name} -> {folder}")
            try:
                summary = runner(configs[cell.name])
                summary = _read_summary(folder) or summary or {}
                row |= {"status": "done"} | _flatten(summary)
            except Exception as err:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on
                row |= {"status": "failed", "error": f"{type(err).__name__}: {err}"}
                log(f"[tlt sweep] cell {cell.name} failed: {row['error']}")
        rows.append(row)
        if dry_run:
            log(f"[tlt sweep] {row['status']:8} {cell.name}: {row['overrides'] or '(base)'}")
        else:
            write_results(rows, grid.output_dir)
    return rows


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
    how much faster than the grid's first cell, its reference, a cell ran."""
    ref = rows[0] if rows else {}

    def ratio(row: dict, key: str) -> float | None:
        return ref[key] / row[key] if ref.get(key) and row.get(key) else None

    return [{"rollout_speedup": ratio(r, "seconds.rollout"), "total_speedup": ratio(r, "seconds.total")} for r in rows]


def to_markdown(rows: list[dict]) -> str:
    rows = [row | extra for row, extra in zip(rows, speedups(rows), strict=True)]
    cols = [c for c in COLUMNS if c != "overrides"]
    cols[cols.index("seconds.total") + 1 : cols.index("seconds.total") + 1] = ["rollout_speedup", "total_speedup"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [_fmt(row.get(c)).replace("|", "\\|").replace("\n", " ") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"rollout_speedup / total_speedup: the first cell's ({rows[0]['cell'] if rows else ''}) summed rollout / "
        "total seconds over the cell's (cells run one after another, not interleaved: sampled responses and the "
        "machine's speed differ between them).",
        "",
        "Seconds are sums over each cell's steps. idle_workers: whether a rank sat idle while another still rolled "
        "out (several processes), where `spot` trains the drafter for free; in one process no worker is ever idle "
        "and `spot` trains only within scheduler.no_idle_budget of each step. spot_steps / idle_train_seconds: the "
        "drafter micro-steps run, and seconds spent, in that idle time.",
        "",
        "Overrides per cell:",
        "",
    ]
    lines += [f"- `{row['cell']}`: `{row['overrides'] or '(base)'}`" for row in rows]
    return "\n".join(lines) + "\n"


def plot_step_time(rows: list[dict], path: Path) -> None:
    """Bar chart of the mean RL step time per cell (0 where a cell has no summary), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["cell"] for row in rows]
    seconds = [row.get("step_seconds_mean") or 0.0 for row in rows]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(rows)), 4))
    ax.bar(range(len(rows)), seconds)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set(ylabel="seconds", title="mean RL step time per cell")
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)


def write_results(rows: list[dict], out: Path) -> None:
    out = Path(out)
    atomic_write_text(out / "sweep.csv", to_csv(rows))
    atomic_write_text(out / "sweep.md", to_markdown(rows))
    plot_step_time(rows, out / "sweep.png")

"""The `tlt sweep` grid file, parsed into typed records and expanded into the cells to run.

A grid file::

    base: tlt.yaml                 # run config, relative to the grid file
    output_dir: runs/ablation      # each cell trains into <output_dir>/<cell>/
    overrides: [grpo.steps=6]      # optional: key=value applied to every cell
    turn_steps: 2                  # optional: cells take turns of this many steps (tlt.eval.sweep)
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
filesystem-safe slug (`speculative.tuner=cost,drafter.kind=eagle` -> `speculative.tuner-cost_drafter.kind-eagle`).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import yaml

from tlt.config import ConfigError


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
    turn_steps: int = 0  # cells take turns of this many steps; 0: each cell runs all its steps in one go

    @classmethod
    def parse(cls, raw: object) -> GridFile:
        given = _given(cls, raw, "")
        return cls(
            base=_path(given["base"], "base"),
            grid=GridSection.parse(given["grid"]),
            output_dir=_path(given.get("output_dir"), "output_dir"),
            overrides=_overrides(given.get("overrides"), "overrides"),
            turn_steps=_turn_steps(given.get("turn_steps", 0)),
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
    turn_steps: int = 0  # GridFile.turn_steps

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


def _turn_steps(raw: object) -> int:
    _expect(isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0, "turn_steps", "an integer >= 0", raw)
    return raw


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
    return Grid(path, path.parent / spec.base, Path(out), overrides, cells, spec.turn_steps)

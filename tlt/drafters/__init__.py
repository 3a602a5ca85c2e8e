"""Drafters behind one interface (`tlt.drafters.base.Drafter`), a registry by kind, and their saved folders.

A saved drafter is a folder with `tlt_drafter.json` ({"kind": ..., plus the drafter's own config}) next to
whatever the drafter needs (HF weights, ...). Classes are resolved lazily by import path, so loading an
n-gram drafter imports no model code.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path

from tlt.files import atomic_folder, check_saved_files, read_json

DRAFTERS = {
    "eagle": "tlt.drafters.eagle:EagleDrafter",
    "small_lm": "tlt.drafters.small_lm:SmallLMDrafter",
    "ngram": "tlt.drafters.ngram:NgramDrafter",
    "suffix": "tlt.drafters.suffix:SuffixDrafter",
    "composed": "tlt.drafters.composed:ComposedDrafter",
}
DRAFTER_JSON = "tlt_drafter.json"


def drafter_class(kind: str) -> type:
    """The Drafter class registered under `kind`."""
    if kind not in DRAFTERS:
        raise ValueError(f"unknown drafter kind {kind!r}; available: {', '.join(sorted(DRAFTERS))}")
    module, name = DRAFTERS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def read_drafter_json(path: str | Path) -> dict:
    """The `tlt_drafter.json` of a saved drafter folder; a clear error when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"drafter folder not found: {path}")
    meta = path / DRAFTER_JSON
    if not meta.is_file():
        raise FileNotFoundError(f"{path} is not a saved tlt drafter (no {DRAFTER_JSON})")
    payload = read_json(meta)
    if not isinstance(payload, dict) or "kind" not in payload:
        raise ValueError(f"{meta} must be a JSON object with a 'kind' key, got {payload!r}")
    return payload


def check_drafter_folder(path: str | Path) -> dict:
    """`read_drafter_json`, and a ValueError naming any other file of the folder that is damaged
    (`tlt.files.check_saved_files`); loads no weights."""
    payload = read_drafter_json(path)
    check_saved_files(path)
    return payload


def load_drafter(path: str | Path):
    """Load a saved drafter of any registered kind (checked first: `check_drafter_folder`)."""
    kind = check_drafter_folder(path)["kind"]
    return drafter_class(kind).load(path)


def drafter_from_spec(spec: str):
    """'ngram' (model-free prompt lookup), 'suffix' (model-free suffix trees) or a saved drafter folder."""
    if spec in ("ngram", "suffix"):
        return drafter_class(spec)()
    return load_drafter(spec)


def save_folder(path: str | Path, fill: Callable[[Path], None], meta: dict) -> Path:
    """Write a drafter folder atomically (tlt.files.atomic_folder): `fill(tmp)` plus `tlt_drafter.json`."""
    with atomic_folder(path) as tmp:
        fill(tmp)
        (tmp / DRAFTER_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return Path(path)

"""Atomic writes: a reader sees the old file (or folder) or the new one, never a half-written one.

Each write goes to a temporary sibling first (same folder, so the final `os.replace` is a rename on one file
system) and is renamed over the target only once complete; a failure leaves the target as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_file(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary sibling of `path` to write; renamed over `path` (world-readable) when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; reports and cards are for everyone to read
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | Path, payload: object) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


class DamagedFileError(ValueError):
    """A saved file that does not read (not JSON, a safetensors file cut short); names the file and what is wrong.
    The CLI prints it as one error line."""


def read_json(path: str | Path) -> object:
    """The JSON in `path`; a DamagedFileError naming the file and where it broke when it is not JSON (a bare
    JSONDecodeError names neither)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DamagedFileError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg})") from e


def read_torch(path: str | Path, **kwargs) -> object:
    """`torch.load(path, map_location="cpu", **kwargs)`; a DamagedFileError naming the file when it does not
    read (torch's own message runs over many lines and, under weights_only, suggests loading untrusted
    pickles)."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", **kwargs)
    except (RuntimeError, pickle.UnpicklingError, EOFError) as e:
        raise DamagedFileError(f"{path}: torch.load cannot read it ({type(e).__name__}): damaged, or not tlt's") from e


def check_saved_files(folder: str | Path) -> None:
    """Raise a DamagedFileError naming the first file under `folder` that does not read: a JSON file that does not
    parse (line and column), a safetensors file whose header does not (damaged, or cut short). Reads the
    safetensors headers, not the tensors: cheap, for a check before anything loads."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(Path(folder).rglob("*.json")):
        read_json(path)
    for path in sorted(Path(folder).rglob("*.safetensors")):
        try:
            with safe_open(path, framework="pt"):
                pass
        except SafetensorError as e:
            raise DamagedFileError(f"{path}: not a readable safetensors file ({e}): damaged, or cut short") from e


def atomic_save_figure(fig, path: str | Path, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG, atomically; closes it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_file(path, suffix=".tmp.png") as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    finally:
        plt.close(fig)


def write_or_check(path: str | Path, text: str, check: bool, command: str) -> int:
    """A generated file: with `check`, 0 if `path` holds `text`, else 1 and a message saying to run `command`;
    without, write `text` to `path` atomically (0)."""
    path = Path(path)
    if not check:
        atomic_write_text(path, text)
        return 0
    if (path.read_text() if path.is_file() else "") == text:
        return 0
    print(f"{path} is out of date: run {command}", file=sys.stderr)
    return 1


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """A temporary sibling folder of `path` to fill; when the block succeeds it replaces `path` (the old folder,
    if any, is moved aside first and removed after). On failure the temporary folder goes and `path` stays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp."))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old."))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_report(path: str | Path, report: dict, render) -> str:
    """A benchmark's outputs: the raw `report` as JSON next to `path` (`path` with suffix .json), then
    `render(report)` as the Markdown at `path`, each atomically; the JSON goes first, so a render that fails keeps
    the measurements. Returns the Markdown."""
    path = Path(path)
    atomic_write_json(path.with_suffix(".json"), report)
    text = render(report)
    atomic_write_text(path, text)
    return text


def subplots(*args, **kwargs):
    """`matplotlib.pyplot.subplots` on the Agg backend (figures here are saved with atomic_save_figure, never
    shown); matplotlib is imported only when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)

"""Trained models shipped with tlt, so the main job starts from a policy and drafter in seconds, not hours.

An asset is a folder `tlt/assets/<name>/`:

    card.json     what it is and how it was made: the exact commands, seed, data mix, SFT and distillation
                  settings, held-out accuracy, drafter acceptance, the machine, and the sha256 of every file
    policy/       a Hugging Face folder: bfloat16 safetensors and the tokenizer (tlt loads it as float32)
    drafter/      a tlt drafter folder (EAGLE head, bfloat16)

Configs name an asset's folders with the `asset` resolver, e.g. `model.path: ${asset:deep_v2/policy}`: it
resolves to the installed folder after checking every file against the card (once per process), so a
truncated download or a Git LFS pointer fails with the file named instead of loading a broken model.
`python -m tlt.assets.build` writes an asset from a `tlt bootstrap` + `tlt train-drafter` run (the card's
commands); tests/test_assets.py checks that each asset loads, matches its card and scores its accuracy.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from tlt.files import read_json

ROOT = Path(__file__).parent
CARD = "card.json"


class AssetError(ValueError):
    """An asset is missing, or its files do not match its card."""


def names() -> list[str]:
    """The assets installed with this tlt."""
    return sorted(p.name for p in ROOT.iterdir() if (p / CARD).is_file())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_card(name: str) -> dict:
    """The card of asset `name`; AssetError naming the installed ones when there is no such asset."""
    card = ROOT / name / CARD
    if not card.is_file():
        raise AssetError(f"no tlt asset named {name!r}; installed: {', '.join(names()) or 'none'}")
    return read_json(card)


def files(folder: Path) -> list[str]:
    """The files under an asset folder (relative POSIX paths, the card excluded), sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != CARD)


@functools.cache
def verify(name: str) -> dict:
    """Check every file of asset `name` against the card's sha256 (no file missing, none extra); returns the
    card. Cached per process."""
    card, folder = read_card(name), ROOT / name
    expected, present = card["files"], files(folder)
    missing, extra = sorted(set(expected) - set(present)), sorted(set(present) - set(expected))
    if missing or extra:
        raise AssetError(f"asset {name!r} at {folder}: missing files {missing}, unexpected files {extra}")
    for rel, digest in expected.items():
        if sha256(folder / rel) != digest:
            raise AssetError(
                f"asset {name!r}: {folder / rel} does not match its card's sha256 (a truncated copy or a Git LFS "
                "pointer?); restore it from the repository (git checkout -- tlt/assets)"
            )
    return card


def asset_path(spec: str) -> str:
    """'<name>/<folder>' (e.g. 'deep_v2/policy') -> the absolute path of that folder of a verified asset."""
    name, _, sub = spec.partition("/")
    verify(name)
    path = ROOT / name / sub
    if not sub or not path.is_dir():
        raise AssetError(f"asset {name!r} has no folder {sub!r}; it has: policy, drafter")
    return str(path)

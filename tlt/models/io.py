"""Saving and loading models as Hugging Face folders (saves are atomic)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tlt.files import atomic_folder, check_saved_files


def save_hf_folder(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path) -> Path:
    """Write model (+ tokenizer) to `path`, atomically (tlt.files.atomic_folder)."""
    with atomic_folder(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(path)


def check_hf_folder(path: str | Path) -> None:
    """Raise unless `path` reads as an HF model folder: FileNotFoundError when it or its config.json is missing,
    ValueError naming a damaged file (`tlt.files.check_saved_files`). Loads no weights."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model folder not found: {path} (run `tlt bootstrap` first, or pass an HF folder)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    check_saved_files(path)


def load_hf_folder(path: str | Path, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer) from an HF folder; a clear error when it is missing, not a model folder or
    damaged (`check_hf_folder`)."""
    check_hf_folder(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer

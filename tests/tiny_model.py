"""A random test-preset model with a small byte-level tokenizer, saved as an HF folder (CLI-level tests)."""

from pathlib import Path

from tlt.models.io import save_hf_folder
from tlt.models.presets import build_model
from tlt.models.tokenizer import train_tokenizer


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    tokenizer = train_tokenizer(["Question: Calculate 1 + 2 - 3.\nSolution:\n1 + 2 = 3"] * 20, vocab_size=300)
    model = build_model(
        "test",
        len(tokenizer),
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        seed=seed,
    )
    return save_hf_folder(model, tokenizer, path)

"""Random test-preset models: in memory for engine tests, or with a tokenizer as an HF folder (CLI tests)."""

from pathlib import Path

import torch

from tlt.models.io import save_hf_folder
from tlt.models.presets import build_model
from tlt.models.tokenizer import train_tokenizer


def save_math_policy(path: Path) -> Path:
    """A random test-preset policy with a tokenizer trained on easy math prompts and solutions (RL runs)."""
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import task_mix, training_problems

    torch.set_num_threads(1)
    data = load_config(None, ["data.max_difficulty=3"]).data
    texts = [format_prompt(p.question) + p.solution for p in training_problems(task_mix(data), 32, seed=0)]
    tokenizer = train_tokenizer(texts, vocab_size=300)
    model = build_model(
        "test", len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, seed=0
    )
    return save_hf_folder(model, tokenizer, path)


def tiny_tokenizer():
    return train_tokenizer(["Question: Calculate 1 + 2 - 3.\nSolution:\n1 + 2 = 3"] * 20, vocab_size=300)


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    tokenizer = tiny_tokenizer()
    model = build_model(
        "test",
        len(tokenizer),
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        seed=seed,
    )
    return save_hf_folder(model, tokenizer, path)


def save_random_target(path: Path, std: float = 0.15, unit_norms: bool = False) -> Path:
    """`random_target` over the tiny tokenizer's vocabulary, saved as an HF folder (for folder-based engines)."""
    tokenizer = tiny_tokenizer()
    return save_hf_folder(random_target(std, unit_norms, vocab_size=len(tokenizer)), tokenizer, path)


def random_target(std: float = 0.15, unit_norms: bool = False, vocab_size: int = 64) -> torch.nn.Module:
    """A random test-preset Qwen2 (vocab 64 by default) with weights ~ N(0, std), seeded.

    std 0.15 gives rare logit ties; with the norm weights left random, greedy continuations fall
    into loops (38 38 38 ...), with `unit_norms` they stay varied.
    """
    torch.set_num_threads(1)
    model = build_model("test", vocab_size=vocab_size)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if unit_norms and "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, std, generator=g)
    return model

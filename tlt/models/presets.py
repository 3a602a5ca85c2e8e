"""Tiny-model presets (data only) and building a Qwen2 causal LM from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class ModelPreset:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0


PRESETS: dict[str, ModelPreset] = {
    # parameter counts are for the default 1024-token vocabulary (tied embeddings)
    "test": ModelPreset(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384),  # ~0.9M
    # 4 layers, not 6: on 2 CPU cores a 6-layer 256-wide model had not learned to copy the reduction lines after
    # 8 minutes of SFT (5% held-out), the 4-layer one reached 45% in the same time
    "tiny": ModelPreset(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024),  # ~4M
    "small": ModelPreset(hidden_size=384, num_layers=8, num_heads=6, num_kv_heads=2, intermediate_size=1536),  # ~18M
    # tiny's width at 3x the depth, so that a one-layer EAGLE head is small next to a target step, as a 7B
    # policy's is: a draft step costs 0.15-0.17 of a target step at batch 1 here (bench_sd_deep_b1.md), about
    # 0.6 on tiny, where the head caps SD. For the GPU check of #4 (eval/gpu_checks.sh); ~28 min of SFT here
    "deep": ModelPreset(hidden_size=256, num_layers=12, num_heads=4, num_kv_heads=2, intermediate_size=1024),  # ~13M
}


# Bootstrap defaults per preset (config overrides applied under the user's YAML and key=value overrides):
# sized so each preset's SFT fits its time budget on 2 CPU cores.
BOOTSTRAP_DEFAULTS: dict[str, tuple[str, ...]] = {
    # <= 60 s: an easy slice of the mix, enough steps to score clearly above an untrained model
    "test": (
        "data.max_difficulty=2",
        "data.train_size=3000",
        "data.heldout_size=128",
        "bootstrap.max_steps=1000",
        "eval.max_new_tokens=128",
    ),
    "tiny": ("bootstrap.max_steps=3000", "bootstrap.precision=auto"),  # ~7 min with native bf16
    "small": ("bootstrap.max_steps=3000",),
    "deep": ("bootstrap.max_steps=3000", "bootstrap.precision=auto"),
}


def preset_from_name(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def qwen2_config(preset: ModelPreset, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> Qwen2Config:
    """A transformers Qwen2Config for a preset; float32, tied embeddings, eager-compatible."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        intermediate_size=preset.intermediate_size,
        max_position_embeddings=preset.max_position_embeddings,
        rope_theta=preset.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )


def build_model(
    preset: str | ModelPreset,
    vocab_size: int,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM for a preset, deterministic for a seed."""
    preset = preset_from_name(preset) if isinstance(preset, str) else preset
    config = qwen2_config(preset, vocab_size, bos_id, eos_id, pad_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def describe(preset: str) -> dict:
    return {"name": preset, **asdict(preset_from_name(preset))}

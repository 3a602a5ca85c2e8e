"""Export a tlt EAGLE drafter to the EAGLE-1 folders that vLLM and SGLang load.

An EAGLE-1 folder is a Hugging Face-style folder: `config.json` of a one-layer Llama (the drafter's decoder
layer) and `model.safetensors` with `fc.weight` and `layers.0.*`, without the embedding and LM head, which both
engines then share from the target (as tlt does). The two engines build the same computation from different
parameter sets:

- vLLM (`EagleLlamaForCausalLM`): fc without bias; q/k/v biases follow `qkv_bias`, the o_proj bias
  `attention_bias`. Load with `speculative_config={"method": "eagle", "model": folder}`.
- SGLang (`LlamaForCausalLMEagle`): fc with a bias, one `attention_bias` for q/k/v and o_proj. The export
  writes zero biases where tlt has none, so the function is the same, and names that class in
  `architectures`: SGLang builds a draft model from the folder's `architectures[0]` and rewrites it only for
  its NextN / MTP drafts, so a plain `LlamaForCausalLM` would load as a one-layer Llama with unmatched weights
  (checked against sglang 0.5.23: `srt/models/llama_eagle.py` LlamaForCausalLMEagle and its `load_weights`,
  which prefixes `model.`; `srt/configs/model_config.py`, the `is_draft_model` rewrites). Load with
  `--speculative-algorithm EAGLE --speculative-draft-model-path folder`.

Both drop the first layer's input norm and apply no final norm, like `tlt.drafters.eagle_head`. The
speculators format is not written: vLLM reads it for EAGLE-3 heads only, whose layer sees
[embedding; feature] concatenated from three target layers, a different network from this EAGLE-1 head.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from tlt.drafters import save_folder
from tlt.drafters.eagle import EagleDrafter

ENGINES = ("vllm", "sglang")
# the class each engine builds the head as: vLLM maps a llama EAGLE draft to EagleLlamaForCausalLM itself
ARCHITECTURES = {"vllm": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle"}
WEIGHTS_FILE = "model.safetensors"


def export_eagle(drafter: EagleDrafter, path: str | Path, engine: str = "vllm") -> Path:
    """Write `drafter` as an EAGLE-1 folder for `engine` ("vllm" or "sglang"), atomically; returns the path.

    The folder also holds the tlt drafter metadata (`tlt_drafter.json`), so `tlt.drafters.load_drafter`
    reads it back (the zero biases of an SGLang export are dropped again).
    """
    if engine not in ENGINES:
        raise ValueError(f"export engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not isinstance(drafter, EagleDrafter):
        raise TypeError(f"only EAGLE drafters export to EAGLE folders, got {type(drafter).__name__}")
    from safetensors.torch import save_file

    state = export_state(drafter, engine)
    config = export_config(drafter, engine)
    meta = {"kind": drafter.kind, **dataclasses.asdict(drafter.config), "exported_for": engine}

    def fill(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return save_folder(path, fill, meta)


def export_state(drafter: EagleDrafter, engine: str) -> dict[str, torch.Tensor]:
    """The head's tensors under EAGLE-1 checkpoint names, float32 on CPU, plus the zero biases SGLang needs."""
    state = {k: v.detach().float().contiguous().cpu() for k, v in drafter.head.state_dict().items()}
    if engine == "sglang":
        cfg = drafter.config
        state["fc.bias"] = torch.zeros(cfg.hidden_size)
        state["layers.0.self_attn.o_proj.bias"] = torch.zeros(cfg.hidden_size)
        if not cfg.attention_bias:
            for name in ("q_proj", "k_proj", "v_proj"):
                rows = state[f"layers.0.self_attn.{name}.weight"].shape[0]
                state[f"layers.0.self_attn.{name}.bias"] = torch.zeros(rows)
    return state


def export_config(drafter: EagleDrafter, engine: str) -> dict:
    """config.json of the one-layer Llama both engines build the head from."""
    cfg = drafter.config
    config = {
        "architectures": [ARCHITECTURES[engine]],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if engine == "vllm":
        config.update(attention_bias=False, qkv_bias=cfg.attention_bias)
    else:
        config.update(attention_bias=True)
    return config

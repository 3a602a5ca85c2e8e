"""EAGLE-1 export: the folder reads back as the same drafter, and the SGLang layout rebuilt with transformers'
own Llama decoder layer computes exactly what tlt's head computes (the vLLM layout holds the same tensors
without the zero biases; vLLM itself runs it in the vllm rows of tests/backends/test_contract.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from tests.tiny_model import random_target
from tlt.cli import main
from tlt.drafters import load_drafter
from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.export import export_eagle
from tlt.drafters.ngram import NgramDrafter


@pytest.fixture(scope="module")
def drafter():
    target = random_target(0.15)
    drafter = EagleDrafter.from_target(target, seed=3)
    with torch.no_grad():
        for p in drafter.head.parameters():
            p.normal_(0, 0.1, generator=torch.Generator().manual_seed(p.numel()))
    return drafter, target


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_reads_back_as_the_same_drafter(drafter, tmp_path, engine):
    d, _ = drafter
    back = load_drafter(export_eagle(d, tmp_path / engine, engine=engine))
    assert back.config == d.config
    for name, tensor in d.head.state_dict().items():
        assert torch.equal(back.head.state_dict()[name], tensor)


def test_vllm_layout(drafter, tmp_path):
    d, target = drafter
    folder = export_eagle(d, tmp_path / "v", engine="vllm")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == target.config.hidden_size
    assert config["qkv_bias"] is True and config["attention_bias"] is False  # Qwen2: q/k/v biases, no o_proj bias
    state = load_file(folder / "model.safetensors")
    assert set(state) == set(d.head.state_dict())  # no fc bias, no embedding, no LM head
    assert not any("embed" in k or "lm_head" in k for k in state)


def test_sglang_layout_equals_tlts_head_under_transformers_llama_layer(drafter, tmp_path):
    d, target = drafter
    folder = export_eagle(d, tmp_path / "s", engine="sglang")
    config = LlamaConfig(**json.loads((folder / "config.json").read_text()))
    state = load_file(folder / "model.safetensors")
    assert not state["fc.bias"].any() and not state["layers.0.self_attn.o_proj.bias"].any()
    layer = LlamaDecoderLayer(config, layer_idx=0)
    layer.load_state_dict(
        {k.removeprefix("layers.0."): v for k, v in state.items() if k.startswith("layers.0.")}, strict=False
    )
    layer.input_layernorm = torch.nn.Identity()  # EAGLE-1's first layer (as vLLM and SGLang build it)
    fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size)
    fc.load_state_dict({"weight": state["fc.weight"], "bias": state["fc.bias"]})
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.config.vocab_size, (2, 7), generator=g)
    hidden = torch.randn(2, 7, config.hidden_size, generator=g)
    positions = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        x = fc(torch.cat([target.get_input_embeddings()(tokens), hidden], -1))
        rope = LlamaRotaryEmbedding(config)(x, positions)
        mask = torch.full((7, 7), float("-inf")).triu(1)[None, None].expand(2, 1, 7, 7)
        out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        out = out[0] if isinstance(out, tuple) else out
        expected = d.head.train_forward(tokens, hidden)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_only_eagle_drafters_export(tmp_path):
    with pytest.raises(TypeError, match="only EAGLE drafters"):
        export_eagle(NgramDrafter(), tmp_path / "x")
    with pytest.raises(ValueError, match="vllm, sglang"):
        export_eagle(EagleDrafter.from_target(random_target()), tmp_path / "y", engine="trt")


def test_export_drafter_cli(drafter, tmp_path, capsys):
    d, _ = drafter
    d.save(tmp_path / "saved")
    assert main(["export-drafter", str(tmp_path / "saved"), str(tmp_path / "out")]) == 0
    assert "num_speculative_tokens" in capsys.readouterr().out
    assert (tmp_path / "out" / "config.json").is_file()
    NgramDrafter().save(tmp_path / "ngram")
    assert main(["export-drafter", str(tmp_path / "ngram"), str(tmp_path / "out2")]) == 2
    assert main(["export-drafter", str(tmp_path / "missing"), str(tmp_path / "out3")]) == 2

"""Choosing a backend from a run config: clear errors before anything loads, an install hint without vLLM."""

import importlib.util

import pytest
import torch

from tests.tiny_model import random_target, save_random_target, tiny_tokenizer
from tlt.backends import check_backend_config, engine_from_config
from tlt.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["rollout.backend=vllm", "speculative.tuner=cost"], "runs one SD schedule fixed at engine start"),
        (["rollout.backend=sglang", "speculative.tuner=ucb1"], "speculative.tuner=fixed"),
        (
            [
                "rollout.backend=vllm",
                "speculative.tuner=fixed",
                "speculative.strategies=['3_1_4']",
                "drafter.kind=small_lm",
            ],
            "eagle, ngram or suffix",
        ),
        (
            [
                "rollout.backend=sglang",
                "speculative.tuner=fixed",
                "speculative.strategies=['3_1_4']",
                "drafter.kind=ngram",
            ],
            "eagle drafters",
        ),
        (
            ["rollout.backend=sglang", "speculative.tuner=fixed", "speculative.strategies=['3_1_4']"],
            "scheduler.policy=never",
        ),
        (["rollout.engine_args.dtype=bfloat16"], "rollout.backend=native, which takes none"),
        (["rollout.backend=vllm", "speculative.enabled=false", "rollout.packed_weights=false"], "packed_weights"),
    ],
)
def test_backend_config_errors_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_backend_config(load_config(None, overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        ["rollout.backend=vllm", "speculative.enabled=false"],
        ["rollout.backend=vllm", "speculative.tuner=fixed", "speculative.strategies=['4_1_5']"],
        ["rollout.backend=native", "speculative.tuner=cost"],
    ],
)
def test_supported_backend_configs_pass(overrides):
    check_backend_config(load_config(None, overrides))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_gives_an_install_hint(tmp_path):
    from tlt.backends.vllm import VLLMEngine

    folder = save_random_target(tmp_path / "target")
    with pytest.raises(ImportError, match="make vllm-env"):
        VLLMEngine(folder, None, 64)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_tlt_train_with_vllm_missing_prints_the_hint(tmp_path, capsys):
    from tests.tiny_model import save_math_policy
    from tlt.cli import main

    save_math_policy(tmp_path / "model")
    args = ["train", "configs/vllm.yaml", f"model.path={tmp_path / 'model'}", "model.preset=test", "grpo.steps=1"]
    assert main([*args, "--output-dir", str(tmp_path / "run")]) == 2
    assert "make vllm-env" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_missing_sglang_gives_an_install_hint():
    from tlt.backends.sglang import import_sglang

    with pytest.raises(ImportError, match="tlt\\[sglang\\]"):
        import_sglang()


@pytest.mark.parametrize("packed", [True, False])
def test_packed_weights_reach_the_native_engine(packed, tmp_path):
    cfg = load_config(None, [f"rollout.packed_weights={str(packed).lower()}"])
    engine = engine_from_config(cfg, random_target(), tiny_tokenizer(), None, torch.device("cpu"), tmp_path)
    assert all(layer.qkv.packed == packed and layer.down.packed == packed for layer in engine.runner.lean.layers)

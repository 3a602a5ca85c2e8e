"""The GPU engines' logic that is tlt's own, checked on CPU: the arguments tlt gives vLLM and SGLang (device per
rank, memory, dtype, stop rules, seeds), the exported draft config per engine, and the config checks. The engines
themselves need a GPU (vLLM on CUDA, SGLang) and are not run here; their upstream references are in the modules'
docstrings."""

import json

import pytest
import torch

from tlt.backends import check_backend_config
from tlt.backends.base import SamplingParams, UnsupportedFeatureError
from tlt.backends.sglang import check_eos, check_result, engine_arguments, request_params, speculative_arguments
from tlt.backends.vllm import engine_arguments as vllm_arguments
from tlt.config import ConfigError, load_config
from tlt.drafters.export import export_config
from tlt.speculative.strategy import SpecStrategy


def test_sglang_export_names_the_eagle_class_and_vllm_the_llama_one():
    from tests.tiny_model import random_target
    from tlt.drafters.eagle import EagleDrafter

    drafter = EagleDrafter.from_target(random_target(0.1), seed=0)
    assert export_config(drafter, "sglang")["architectures"] == ["LlamaForCausalLMEagle"]
    assert export_config(drafter, "vllm")["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize(("device", "gpu"), [("cuda", 0), ("cuda:1", 1), (torch.device("cuda", 3), 3)])
def test_sglang_engine_starts_on_the_ranks_gpu(device, gpu, tmp_path):
    args = engine_arguments(tmp_path, 256, device, "bfloat16", 7, {})
    assert args["base_gpu_id"] == gpu and args["random_seed"] == 7 and args["context_length"] == 256


def test_sglang_refuses_cpu_and_float32_without_an_attention_backend(tmp_path):
    with pytest.raises(UnsupportedFeatureError, match="CUDA only"):
        engine_arguments(tmp_path, 256, "cpu", "bfloat16", 0, {})
    with pytest.raises(UnsupportedFeatureError, match="attention_backend"):
        engine_arguments(tmp_path, 256, "cuda", "float32", 0, {})
    args = engine_arguments(tmp_path, 256, "cuda", "float32", 0, {"attention_backend": "triton"})
    assert args["attention_backend"] == "triton" and args["dtype"] == "float32"


def test_sglang_engine_args_override_tlts():
    args = engine_arguments("m", 256, "cuda", "bfloat16", 0, {"base_gpu_id": 5, "mem_fraction_static": 0.4})
    assert args["base_gpu_id"] == 5 and args["mem_fraction_static"] == 0.4


def test_sglang_stops_at_the_eos_token_only_and_seeds_only_when_deterministic():
    sampling = SamplingParams(temperature=1.0, max_new_tokens=50, seed=10)
    params = request_params(sampling, room=30, eos_token_id=2, seeded=False, k=3)
    assert params["ignore_eos"] is False and params["stop_token_ids"] == [2]  # ignore_eos would skip stop ids
    assert params["max_new_tokens"] == 30 and "sampling_seed" not in params
    assert request_params(sampling, 30, 2, seeded=True, k=3)["sampling_seed"] == 13
    free = request_params(sampling, 30, None, False, 0)
    assert free["ignore_eos"] is True and free["stop_token_ids"] == []


def test_sglang_refuses_a_model_folder_with_other_eos_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    check_eos(tmp_path, 2)
    check_eos(tmp_path, None)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    with pytest.raises(UnsupportedFeatureError, match=r"\[7\]"):
        check_eos(tmp_path, 2)


def test_sglang_weight_update_failures_raise():
    check_result((True, "Success"), "update_weights_from_tensor")
    with pytest.raises(RuntimeError, match="update_weights_from_tensor failed: shape mismatch"):
        check_result((False, "shape mismatch"), "update_weights_from_tensor")


def test_sglang_speculative_arguments_follow_the_strategy(tmp_path):
    args = speculative_arguments(tmp_path, SpecStrategy.parse("4_2_8"))
    assert args["speculative_algorithm"] == "EAGLE" and args["speculative_draft_model_path"] == str(tmp_path)
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (
        4,
        2,
        8,
    )


def test_vllm_cpu_arguments_run_eager_without_gpu_settings(tmp_path):
    args = vllm_arguments(tmp_path, 256, torch.device("cpu"), "float32", 16, 0)
    assert args["enforce_eager"] is True
    assert "gpu_memory_utilization" not in args and "distributed_executor_backend" not in args


def test_vllm_cuda_one_process_shares_the_gpu_and_lands_on_gpu_0(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = vllm_arguments(tmp_path, 256, torch.device("cuda"), "bfloat16", 16, 0)
    assert args["enforce_eager"] is False and args["gpu_memory_utilization"] == 0.3
    assert "distributed_executor_backend" not in args
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        vllm_arguments(tmp_path, 256, torch.device("cuda", 1), "bfloat16", 16, 0)


def test_vllm_cuda_ranks_each_run_their_engine_on_their_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    args = vllm_arguments(tmp_path, 256, torch.device("cuda", 1), "bfloat16", 16, 0)
    assert args["distributed_executor_backend"] == "external_launcher"
    with pytest.raises(ValueError, match="cuda:LOCAL_RANK = cuda:1"):
        vllm_arguments(tmp_path, 256, torch.device("cuda", 0), "bfloat16", 16, 0)


def test_int8_drafting_on_cuda_fails_at_config_check():
    cfg = load_config(None, ["speculative.draft_int8=true", "train.device=cuda"])
    with pytest.raises(ConfigError, match="speculative.draft_int8.*train.device=cuda"):
        check_backend_config(cfg)
    check_backend_config(load_config(None, ["speculative.draft_int8=true", "train.device=cpu"]))


def test_vllm_suffix_decoding_carries_the_suffix_drafters_settings():
    """A tlt suffix drafter maps onto vLLM's method="suffix" with its depth, spec factor and token floor; vLLM
    keeps its own history (a global cache of SUFFIX_CACHED_REQUESTS responses)."""
    from tlt.backends.vllm import SUFFIX_CACHED_REQUESTS, SpecSettings
    from tlt.drafters.suffix import SuffixDrafter

    spec = SpecSettings.of(SuffixDrafter(max_depth=32, spec_factor=2.0, min_token_prob=0.2), "4_1_5", 8)
    config = spec.vllm_config(None, max_num_seqs=64)
    assert config["method"] == "suffix" and config["num_speculative_tokens"] == 4
    assert config["suffix_decoding_max_tree_depth"] == 32 and config["suffix_decoding_max_spec_factor"] == 2.0
    assert config["suffix_decoding_min_token_prob"] == 0.2
    assert config["suffix_decoding_max_cached_requests"] == SUFFIX_CACHED_REQUESTS
    assert config["num_speculative_tokens_per_batch_size"] == [(1, 8, 4), (9, 64, 0)]

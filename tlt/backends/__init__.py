"""Rollout engines behind one contract (`tlt.backends.base.RolloutEngine`): native (pure PyTorch, the
default, every feature), vllm and sglang (imported only when chosen). `engine_from_config` builds the one a
run config asks for."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tlt.backends.base import RolloutEngine
    from tlt.config import RunConfig
    from tlt.drafters.base import Drafter


def check_backend_config(cfg: RunConfig) -> None:
    """What `rollout.backend` needs of the other sections; raises ConfigError before anything loads."""
    from tlt.config import ConfigError

    backend, spec = cfg.rollout.backend, cfg.speculative
    if cfg.rollout.cuda_graphs and backend != "native":
        raise ConfigError(
            f"rollout.cuda_graphs: a native-engine option (vLLM and SGLang capture their own graphs on CUDA), got "
            f"rollout.backend={backend}; remove it"
        )
    if not cfg.rollout.packed_weights and backend != "native":
        raise ConfigError(
            f"rollout.packed_weights: a native-engine option (vLLM's CPU backend packs its own weights), got "
            f"rollout.backend={backend}; remove it"
        )
    if cfg.rollout.engine_args and backend == "native":
        raise ConfigError(
            f"rollout.engine_args: keywords for the vllm / sglang engine, got {dict(cfg.rollout.engine_args)} with "
            "rollout.backend=native, which takes none; remove them or pick rollout.backend=vllm"
        )
    if spec.draft_int8 and (backend != "native" or cfg.drafter.kind != "eagle"):
        raise ConfigError(
            "speculative.draft_int8: int8 drafting is a native-engine option for the eagle drafter, got "
            f"rollout.backend={backend}, drafter.kind={cfg.drafter.kind}; set speculative.draft_int8=false"
        )
    if spec.draft_int8 and on_cuda(cfg.train.device):
        raise ConfigError(
            "speculative.draft_int8: int8 drafting uses fbgemm's CPU kernels (torch.ao dynamic quantization), but "
            f"train.device={cfg.train.device} runs on CUDA here; set speculative.draft_int8=false or train.device=cpu"
        )
    if backend == "native" or not spec.enabled:
        return
    if spec.tuner != "fixed":
        raise ConfigError(
            f"speculative.tuner: rollout.backend={backend} runs one SD schedule fixed at engine start (it cannot "
            f"ask a tuner before every decode step), got {spec.tuner!r}; use speculative.tuner=fixed (SD with "
            "speculative.strategies[0] while at most speculative.threshold sequences run), "
            "speculative.enabled=false, or the native backend for the adaptive tuners"
        )
    if backend == "vllm" and cfg.drafter.kind not in ("eagle", "ngram", "suffix"):
        raise ConfigError(
            f"drafter.kind: rollout.backend=vllm runs eagle, ngram or suffix drafters, got {cfg.drafter.kind!r}"
        )
    if backend == "sglang" and cfg.drafter.kind != "eagle":
        raise ConfigError(f"drafter.kind: rollout.backend=sglang runs eagle drafters, got {cfg.drafter.kind!r}")
    if backend == "sglang" and cfg.scheduler.policy != "never":
        raise ConfigError(
            "scheduler.policy: rollout.backend=sglang cannot reload a draft model in place, so the drafter stays "
            f"frozen: set scheduler.policy=never (got {cfg.scheduler.policy!r}), or use the native or vllm backend"
        )


def on_cuda(device: str) -> bool:
    """Whether a `train.device` value (auto, cpu, cuda) runs on a GPU on this machine."""
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def engine_from_config(
    cfg: RunConfig,
    policy: torch.nn.Module,
    tokenizer,
    drafter: Drafter | None,
    device: torch.device,
    work_dir: str | Path,
    return_hidden: bool = False,
) -> RolloutEngine:
    """The rollout engine of `cfg.rollout.backend` over a copy of `policy`, with `drafter` when SD is on.

    native: a deep copy of the policy in memory, the tuner of `speculative.tuner`. vllm / sglang: the policy is
    saved as an HF folder next to `work_dir` (by rank 0, collective when torch.distributed is initialized) and
    the engine loads it, writing its weight updates under `work_dir`; SD with `speculative.strategies[0]` while at
    most `speculative.threshold` sequences run (tuner `fixed`), with `rollout.engine_args` passed to the engine
    (e.g. dtype, gpu_memory_utilization). Prompts longer than the engine allows keep their
    last tokens. On CPU, the vllm engine of rank r is bound to core r. `return_hidden`: rollouts carry the
    target's hidden states (native engine only).
    """
    from tlt.schedulers.tuners import tuner_from_config

    check_backend_config(cfg)
    r, spec = cfg.rollout, cfg.speculative
    sd = spec.enabled and drafter is not None
    if r.backend == "native":
        from tlt.backends.native import NativeEngine

        tuner = tuner_from_config(spec) if spec.enabled else None
        model = copy.deepcopy(policy)
        return NativeEngine(
            model,
            tokenizer.eos_token_id,
            r.max_seq_len,
            tuner,
            device=device,
            truncate_prompts="left",
            draft_int8=spec.draft_int8,
            return_hidden=return_hidden,
            cuda_graphs=r.cuda_graphs,
            packed_weights=r.packed_weights,
        )
    if return_hidden:
        raise ValueError(f"rollout.backend={r.backend} returns no hidden states; only the native engine does")
    import torch.distributed as dist

    from tlt.models.io import save_hf_folder

    work_dir = Path(work_dir)
    folder = work_dir.parent / "start"  # shared by the ranks: transformers saves on rank 0 only
    if not dist.is_initialized() or dist.get_rank() == 0:
        save_hf_folder(policy, tokenizer, folder)
    if dist.is_initialized():
        dist.barrier()
    options = dict(
        drafter=drafter if sd else None,
        strategy=spec.strategies[0] if sd else None,
        sd_max_batch=spec.threshold if sd else None,
        truncate_prompts="left",
        work_dir=work_dir,
        seed=cfg.seed,
        engine_args=dict(r.engine_args),
    )
    if r.backend == "vllm":
        from tlt.backends.vllm import VLLMEngine

        core = dist.get_rank() if dist.is_initialized() else None
        return VLLMEngine(folder, tokenizer.eos_token_id, r.max_seq_len, device=device, cpu_core=core, **options)
    from tlt.backends.sglang import SGLangEngine

    options["sd_max_batch"] = None  # SGLang has no batch-size schedule: SD at every batch size
    return SGLangEngine(folder, tokenizer.eos_token_id, r.max_seq_len, device=device, **options)

"""The SGLang rollout backend: SGLang's offline engine (`sglang.Engine`) behind the `RolloutEngine` contract.

GPU only (SGLang has no CPU build), written against SGLang's documented offline API and imported only when
chosen; the contract suite (tests/backends/test_contract.py) runs it when a CUDA GPU and SGLang are present.
What maps onto SGLang (`CAPABILITIES`):

- EAGLE speculative decoding with a tlt EAGLE drafter exported to SGLang's EAGLE-1 folder
  (`tlt.drafters.export`, with the zero biases SGLang's layout has), with trees: a strategy
  `steps_topk_verifytokens` is SGLang's speculative_num_steps / speculative_eagle_topk /
  speculative_num_draft_tokens. SD is on at every batch size (no batch-size schedule) and the strategy is
  fixed when the engine starts.
- Policy weights updated in place from tensors (`update_weights_from_tensor`, cache flushed). The draft model
  is not reloaded in place (SGLang's tensor update targets the target model), so a new drafter needs a new
  engine: RL runs with this backend keep the drafter frozen (scheduler.policy=never).
- Log-probs: SGLang returns log-probs of the unscaled distribution, so sampling is limited to temperature 1
  (or greedy), where they are the contract's; top-k / top-p are refused for the same reason.
- No hidden states and no per-iteration stats (`step_stats`: two aggregates per call, from SGLang's verify
  counts).

Written against sglang 0.5.23's source (pinned in the `sglang` extra; SGLang has no CPU build, so no tlt test
has run it): `srt/entrypoints/engine.py` (Engine.generate, begin_weight_update / update_weights_from_tensor /
end_weight_update: a weight update is a session, and they return (success, message) rather than raising;
`srt/managers/scheduler_components/weight_updater.py` for the runner selector), `srt/managers/schedule_batch.py`
(Req._check_token_based_finish: `ignore_eos` skips every stop-token check, `stop_token_ids` included),
`srt/sampling/sampling_batch_info.py` (per-request `sampling_seed` is used only with
`enable_deterministic_inference`), `srt/arg_groups/fields/device.py` (`base_gpu_id`, default 0: the GPU an engine
starts on). Engine defaults here: bfloat16 (SGLang's default attention backends, FlashInfer and FA3, run 16-bit
types only; float32 needs an `attention_backend` in engine_args, e.g. "triton"), the GPU of `device`
(cuda:LOCAL_RANK under `tlt train`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from tlt.backends.base import (
    Capabilities,
    DecodeStepStats,
    FinishReason,
    Rollout,
    SamplingParams,
    TargetShapes,
    UnsupportedFeatureError,
    call_stats,
    check_prompts,
    import_optional,
)
from tlt.drafters.base import Drafter
from tlt.speculative.strategy import SpecStrategy

CAPABILITIES = Capabilities(
    per_step_strategy=False,
    drafter_hot_swap=False,
    hidden_states=False,
    tree_drafts=True,
    drafters=("eagle",),
    per_step_stats=False,
)
INSTALL_HINT = "the sglang backend needs SGLang on a CUDA machine: `pip install 'tlt[sglang]'` (no CPU build exists)"


def import_sglang():
    """The `sglang` module, or an ImportError that says how to install it."""
    return import_optional("sglang", INSTALL_HINT)


class SGLangEngine:
    """RolloutEngine over SGLang for an HF Qwen2 / Llama folder (arguments as `tlt.backends.vllm.VLLMEngine`;
    `sd_max_batch` must stay None: SGLang has no batch-size schedule for SD)."""

    capabilities = CAPABILITIES
    tuner = None

    def __init__(
        self,
        model_path: str | Path,
        eos_token_id: int | None,
        max_seq_len: int,
        drafter: Drafter | None = None,
        strategy: SpecStrategy | str | None = None,
        sd_max_batch: int | None = None,
        device: str | torch.device = "cuda",
        dtype: str = "bfloat16",
        truncate_prompts: str | None = None,
        work_dir: str | Path | None = None,
        seed: int = 0,
        engine_args: Mapping | None = None,
    ):
        if (drafter is None) != (strategy is None):
            raise ValueError("give a drafter and a strategy together (or neither, for plain decoding)")
        if sd_max_batch is not None:
            raise UnsupportedFeatureError("the sglang backend has no batch-size schedule for SD: use sd_max_batch=None")
        if drafter is not None and drafter.kind not in CAPABILITIES.drafters:
            raise UnsupportedFeatureError(f"the sglang backend runs eagle drafters, not {drafter.kind!r}")
        self.model_path, self.target = Path(model_path), TargetShapes.read(Path(model_path))
        self.eos_token_id, self.max_seq_len, self.truncate_prompts = eos_token_id, max_seq_len, truncate_prompts
        self.strategy = None if strategy is None else SpecStrategy.parse(strategy)
        self.work_dir = Path(work_dir) if work_dir is not None else self.model_path.parent / "sglang-engine"
        self.drafter: Drafter | None = None
        args = engine_arguments(self.model_path, max_seq_len, device, dtype, seed, engine_args or {})
        self.seeded = bool(args.get("enable_deterministic_inference"))
        check_eos(self.model_path, eos_token_id)
        if drafter is not None:
            self.target.check_drafter(drafter)
            from tlt.drafters.export import export_eagle

            folder = export_eagle(drafter, self.work_dir / "drafter", engine="sglang")
            args |= speculative_arguments(folder, self.strategy) | dict(engine_args or {})
            self.drafter = drafter
        self.engine = import_sglang().Engine(**args)
        self.weights_version: int | None = None
        self.step_stats: list[DecodeStepStats] = []

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, n: int = 1) -> list[Rollout]:
        """n samples per prompt, grouped by prompt; with enable_deterministic_inference in engine_args, sample i
        of prompt p is seeded seed + p * n + i (otherwise SGLang samples from its engine-wide random_seed)."""
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        if sampling.top_k or sampling.top_p < 1 or sampling.temperature not in (0.0, 1.0):
            raise UnsupportedFeatureError(
                "the sglang backend returns log-probs of the unscaled distribution: sample at temperature 1 "
                "(or greedy) without top-k / top-p, or use the native backend"
            )
        self.step_stats = []
        if len(prompts) == 0:
            return []
        ids = check_prompts(prompts, self.max_seq_len, self.truncate_prompts, sampling.max_new_tokens)
        inputs = [p for p in ids for _ in range(n)]
        params = [self._params(sampling, len(p), k) for k, p in enumerate(inputs)]
        start = time.perf_counter()
        outputs = self.engine.generate(input_ids=inputs, sampling_params=params, return_logprob=True)
        seconds = time.perf_counter() - start
        rollouts = [_rollout(out, k // n, k % n, inputs[k]) for k, out in enumerate(outputs)]
        self._record(outputs, sum(r.token_ids.numel() for r in rollouts), seconds)
        return rollouts

    def _params(self, sampling: SamplingParams, prompt_len: int, k: int) -> dict:
        return request_params(sampling, self.max_seq_len - prompt_len, self.eos_token_id, self.seeded, k)

    def _record(self, outputs: list[dict], tokens: int, seconds: float) -> None:
        """Aggregate step_stats (`call_stats`): SD runs at every step, so all tokens but each sample's first
        (from prefill) come from verifies."""
        verifies = sum(out["meta_info"].get("spec_verify_ct", 0) for out in outputs) if self.drafter else 0
        accepted = tokens - len(outputs) - verifies if verifies else 0
        drafted = verifies * (self.strategy.verify_tokens - 1) if verifies else 0
        strategy = None if self.strategy is None else str(self.strategy)
        self.step_stats = call_stats(strategy, verifies, drafted, accepted, len(outputs), tokens, seconds)

    def check_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.target.check(state_dict)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Load the tensors into the running engine in place (SGLang flushes its cache afterwards)."""
        self.check_weights(state_dict)
        named = [(k, v.detach()) for k, v in state_dict.items() if k in self.target.shapes]
        check_result(self.engine.begin_weight_update(selector="target"), "begin_weight_update")
        try:
            check_result(self._update_target(named), "update_weights_from_tensor")
        finally:
            check_result(self.engine.end_weight_update(), "end_weight_update")
        self.weights_version = version

    def _update_target(self, named: list[tuple[str, torch.Tensor]]):
        """`Engine.update_weights_from_tensor` (srt/entrypoints/engine.py, 0.5.23) with selector "target": the
        public call sends the tensors to every runner, and the EAGLE draft's loader (LlamaForCausalLMEagle.
        load_weights) would take the target's names as its own under a `model.` prefix. The draft shares the
        target's embedding and LM head, so it sees their update."""
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

        engine = self.engine
        request = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=engine._serialize_tensors_per_rank(named, None),
            flush_cache=True,
            selector="target",
        )
        return engine.loop.run_until_complete(engine.tokenizer_manager.update_weights_from_tensor(request, None))

    def check_drafter(self, drafter: Drafter | None) -> None:
        """Only the running drafter itself (or a copy with equal weights) can be installed: SGLang does not
        reload a draft model in place."""
        if drafter is None and self.drafter is None:
            return
        if drafter is None or self.drafter is None or drafter.kind != "eagle":
            raise UnsupportedFeatureError(
                "this SGLang engine cannot switch drafters while running; build a new SGLangEngine"
            )
        self.target.check_drafter(drafter)
        running = self.drafter.head.state_dict()
        if any(not torch.equal(v.cpu(), running[k].cpu()) for k, v in drafter.head.state_dict().items()):
            raise UnsupportedFeatureError(
                "SGLang does not reload a draft model in place: new drafter weights need a new SGLangEngine "
                "(RL with rollout.backend=sglang keeps the drafter frozen: scheduler.policy=never)"
            )

    def set_drafter(self, drafter: Drafter | None) -> None:
        self.check_drafter(drafter)
        self.drafter = drafter

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()


def engine_arguments(
    model_path: Path, max_seq_len: int, device: str | torch.device, dtype: str, seed: int, engine_args: Mapping
) -> dict:
    """`sglang.Engine` keywords: the model, on the GPU of `device` (`base_gpu_id`), with `engine_args` on top.

    Raises UnsupportedFeatureError for a non-CUDA device, and for float32 without an explicit attention backend
    (SGLang's default ones, FlashInfer and FA3, run fp16 / bf16 only)."""
    gpu = torch.device(device)
    if gpu.type != "cuda":
        raise UnsupportedFeatureError(f"the sglang backend runs on CUDA only, got device={str(device)!r}")
    args = dict(
        model_path=str(model_path),
        dtype=dtype,
        context_length=max_seq_len,
        random_seed=seed,
        skip_tokenizer_init=True,
        base_gpu_id=gpu.index or 0,
    )
    args |= dict(engine_args)
    if args["dtype"] in ("float32", "float") and "attention_backend" not in args:
        raise UnsupportedFeatureError(
            "sglang with dtype float32: its default attention backends (FlashInfer, FA3) run fp16 / bf16 only; "
            "use dtype bfloat16 (the default) or name one in rollout.engine_args, e.g. attention_backend: triton"
        )
    return args


def speculative_arguments(draft_folder: Path, strategy: SpecStrategy) -> dict:
    """`sglang.Engine` keywords of EAGLE-1 drafting from an exported folder (`tlt.drafters.export`)."""
    return dict(
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=str(draft_folder),
        speculative_num_steps=strategy.steps,
        speculative_eagle_topk=strategy.topk,
        speculative_num_draft_tokens=strategy.verify_tokens,
    )


def request_params(sampling: SamplingParams, room: int, eos_token_id: int | None, seeded: bool, k: int) -> dict:
    """SGLang sampling parameters of request k: stop at eos_token_id only (SGLang's `ignore_eos` would skip
    `stop_token_ids` too, so it is set only when there is no stop token); seeded when the engine runs
    deterministic inference, the only mode in which SGLang reads `sampling_seed`."""
    params = {
        "temperature": sampling.temperature,
        "max_new_tokens": min(sampling.max_new_tokens, room),
        "ignore_eos": eos_token_id is None,
        "stop_token_ids": [] if eos_token_id is None else [eos_token_id],
    }
    if seeded and sampling.seed is not None:
        params["sampling_seed"] = sampling.seed + k
    return params


def check_eos(model_path: Path, eos_token_id: int | None) -> None:
    """SGLang also stops at the model folder's own eos ids (config.json / generation_config.json): they must be
    the engine's eos_token_id, or generation would stop where the contract says it must not."""
    import json

    if eos_token_id is None:
        return  # ignore_eos: SGLang stops at no token
    found = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_path) / name
        if path.exists():
            eos = json.loads(path.read_text()).get("eos_token_id")
            found |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    extra = found - {eos_token_id}
    if extra:
        raise UnsupportedFeatureError(
            f"{model_path} names eos_token_id {sorted(extra)}, where SGLang would also stop; the engine's stop "
            f"token is {eos_token_id}: save the model with eos_token_id={eos_token_id}"
        )


def check_result(result, what: str) -> None:
    """SGLang's weight-update calls return (success, message) instead of raising."""
    success, message = result if isinstance(result, tuple) else (result.success, result.message)
    if not success:
        raise RuntimeError(f"sglang {what} failed: {message}")


def _rollout(out: dict, prompt_index: int, sample_index: int, prompt: list[int]) -> Rollout:
    meta = out["meta_info"]
    tokens = list(out["output_ids"])
    logprobs = [entry[0] for entry in meta["output_token_logprobs"]][: len(tokens)]
    reason = (meta.get("finish_reason") or {}).get("type")
    return Rollout(
        prompt_index=prompt_index,
        sample_index=sample_index,
        prompt_ids=torch.tensor(prompt, dtype=torch.long),
        token_ids=torch.tensor(tokens, dtype=torch.long),
        logprobs=torch.tensor(logprobs, dtype=torch.float32),
        finish_reason=FinishReason.STOP if reason == "stop" else FinishReason.LENGTH,
    )

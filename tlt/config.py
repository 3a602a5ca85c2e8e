"""Typed configs: one flat dataclass per component, composed into `RunConfig` (two levels deep at most).

Defaults live only here. Each dataclass validates itself in `__post_init__` with a message that names the key and
what is allowed. `load_config(yaml_path, overrides)` merges a YAML file and `key=value` overrides onto the defaults
with OmegaConf; unknown keys and wrong types fail with the offending key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tlt.speculative.strategy import SpecStrategy

PRECISIONS = ("32-true", "bf16-mixed", "auto")  # auto: tlt.machine.resolve_precision
DRAFTER_KINDS = ("eagle", "small_lm", "ngram", "suffix", "eagle+suffix", "small_lm+suffix")


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the key."""


def _asset(spec: str) -> str:
    from tlt.assets import asset_path

    return asset_path(spec)


# `${asset:deep_v2/policy}` in a config: that folder of a tlt asset, checked against its card (tlt.assets)
OmegaConf.register_resolver("asset", _asset, replace=True)


def _check(ok: bool, key: str, allowed: str, value: object) -> None:
    if not ok:
        raise ConfigError(f"{key}: got {value!r}; allowed: {allowed}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, "one of " + ", ".join(choices), value)


@dataclass
class ModelConfig:
    preset: str = "tiny"  # tiny-model preset (tlt.models.presets): test, tiny, small, deep
    path: str | None = None  # an HF folder to start from instead of a fresh preset model
    vocab_size: int = 1024  # tokenizer vocabulary for freshly built models
    seed: int = 0  # initialisation of a fresh preset model

    def __post_init__(self) -> None:
        from tlt.models.presets import PRESETS

        _check_choice("model.preset", self.preset, tuple(PRESETS))
        _check(300 <= self.vocab_size <= 65536, "model.vocab_size", "an integer in [300, 65536]", self.vocab_size)


@dataclass
class DataConfig:
    # reasoning-gym datasets of the generated mix (any name reasoning-gym registers; checked on load)
    families: list[str] = field(default_factory=lambda: ["chain_sum", "basic_arithmetic", "products"])
    weights: list[float] = field(default_factory=lambda: [0.6, 0.25, 0.15])  # sampling weight per family
    max_difficulty: int = 16  # difficulty levels 1..max_difficulty (level d: d + 2 terms)
    difficulty_decay: float = 0.7  # P(d) ~ decay^(d-1): most problems easy, a long tail of hard ones
    train_size: int = 20000  # problems for supervised bootstrap / RL prompts
    heldout_size: int = 256  # disjoint held-out problems for evaluation
    jsonl: list[str] = field(default_factory=list)  # GSM8K/MATH JSONL files: tlt train's prompts instead of the mix
    seed: int = 0  # problem generation and the train / held-out split

    def __post_init__(self) -> None:
        _check(len(self.families) > 0, "data.families", "a non-empty list of task families", self.families)
        from tlt.data.tasks import gym_family_names, unknown_families

        unknown = unknown_families(self.families)
        _check(not unknown, "data.families", "reasoning-gym datasets: " + ", ".join(gym_family_names()), unknown)
        _check(
            len(self.weights) == len(self.families),
            "data.weights",
            f"one weight per family ({len(self.families)} values)",
            self.weights,
        )
        _check(
            all(w >= 0 for w in self.weights) and sum(self.weights) > 0,
            "data.weights",
            "non-negative, sum > 0",
            self.weights,
        )
        _check(
            1 <= self.max_difficulty <= 50,
            "data.max_difficulty",
            "an integer in [1, 50]",
            self.max_difficulty,
        )
        _check(
            0 < self.difficulty_decay <= 1,
            "data.difficulty_decay",
            "a float in (0, 1]",
            self.difficulty_decay,
        )
        _check(self.train_size >= 1, "data.train_size", "an integer >= 1", self.train_size)
        _check(self.heldout_size >= 1, "data.heldout_size", "an integer >= 1", self.heldout_size)


@dataclass
class BootstrapConfig:
    """Supervised fine-tuning of the base policy on generated step-by-step solutions."""

    max_steps: int = 1500  # SFT optimizer steps of `tlt bootstrap`
    batch_size: int = 8  # per process; tiny models learn these tasks in fewer examples with many small steps
    lr: float = 1e-3  # AdamW peak learning rate (linear warm-up, then cosine decay)
    warmup_steps: int = 30  # learning-rate warm-up steps
    weight_decay: float = 0.01  # AdamW weight decay
    max_length: int = 384  # prompt + response tokens; longer training examples are dropped
    devices: int = 1  # CPU processes (DDP over gloo when > 1)
    checkpoint_every: int = 250  # SFT steps between checkpoints (an interrupted bootstrap resumes from the last)
    # Lightning precision: 32-true, bf16-mixed (~1.6x faster on CPUs with native bf16, ~40x slower without), or
    # auto (bf16-mixed on CUDA and on CPUs with AMX / AVX-512 BF16, else 32-true: tlt.machine.resolve_precision)
    precision: str = "32-true"

    def __post_init__(self) -> None:
        _check_choice("bootstrap.precision", self.precision, PRECISIONS)
        _check(self.max_steps >= 1, "bootstrap.max_steps", "an integer >= 1", self.max_steps)
        _check(self.batch_size >= 1, "bootstrap.batch_size", "an integer >= 1", self.batch_size)
        _check(0 < self.lr < 1, "bootstrap.lr", "a float in (0, 1)", self.lr)
        _check(self.warmup_steps >= 0, "bootstrap.warmup_steps", "an integer >= 0", self.warmup_steps)
        _check(self.weight_decay >= 0, "bootstrap.weight_decay", "a float >= 0", self.weight_decay)
        _check(self.max_length >= 16, "bootstrap.max_length", "an integer >= 16", self.max_length)
        _check(self.devices >= 1, "bootstrap.devices", "an integer >= 1", self.devices)
        _check(self.checkpoint_every >= 1, "bootstrap.checkpoint_every", "an integer >= 1", self.checkpoint_every)


@dataclass
class RolloutConfig:
    backend: str = "native"  # native, vllm, sglang
    samples_per_prompt: int = 8  # GRPO group size G
    prompts_per_step: int = 16  # prompts per RL step (each sampled samples_per_prompt times)
    max_new_tokens: int = 512  # response length limit
    temperature: float = 1.0  # sampling temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling mass (1.0: off)
    top_k: int = 0  # 0 = off
    max_seq_len: int = 1024  # prompt + response limit of the engine's KV cache
    engine_args: dict[str, Any] = field(default_factory=dict)  # vllm / sglang engine keywords (dtype, memory)
    cuda_graphs: bool = False  # native: static-shape decode / verify, CUDA graphs on CUDA (uncaptured on CPU)
    packed_weights: bool = True  # native on CPU: the target multiplies by oneDNN-packed weight copies (faster)

    def __post_init__(self) -> None:
        _check_choice("rollout.backend", self.backend, ("native", "vllm", "sglang"))
        _check(
            self.samples_per_prompt >= 1,
            "rollout.samples_per_prompt",
            "an integer >= 1",
            self.samples_per_prompt,
        )
        _check(self.prompts_per_step >= 1, "rollout.prompts_per_step", "an integer >= 1", self.prompts_per_step)
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", "an integer >= 1", self.max_new_tokens)
        _check(self.temperature >= 0, "rollout.temperature", "a float >= 0 (0 = greedy)", self.temperature)
        _check(0 < self.top_p <= 1, "rollout.top_p", "a float in (0, 1]", self.top_p)
        _check(self.top_k >= 0, "rollout.top_k", "an integer >= 0 (0 = off)", self.top_k)
        _check(
            self.max_seq_len > self.max_new_tokens,
            "rollout.max_seq_len",
            f"an integer > rollout.max_new_tokens ({self.max_new_tokens})",
            self.max_seq_len,
        )


@dataclass
class SpeculativeConfig:
    enabled: bool = True  # speculative decoding in the rollout (False: plain decoding, no drafter)
    tuner: str = "cost"  # off, fixed, beg, ucb1, cost
    # SD strategies the tuner chooses from, as steps_topk_verifytokens (topk 1: chains, > 1: trees)
    strategies: list[str] = field(default_factory=lambda: ["2_1_3", "3_1_4", "4_1_5", "3_2_6"])
    threshold: int = 32  # `fixed`: SD only when the running batch is at most this
    epsilon: float = 0.1  # `beg` and `cost`: exploration rate
    window: int = 300  # reward window of the bandits
    buckets: list[str] = field(default_factory=lambda: ["1", "4", "20", "inf"])  # `beg`/`ucb1` batch-size upper bounds
    seed: int = 0  # the tuner's exploration
    draft_int8: bool = False  # native engine, eagle drafter, CPU: draft with an int8 copy of the head

    def __post_init__(self) -> None:
        if str(self.tuner) == "False":  # YAML 1.1 reads an unquoted `off` as the boolean false
            self.tuner = "off"
        _check_choice("speculative.tuner", self.tuner, ("off", "fixed", "beg", "ucb1", "cost"))
        _check(
            len(self.strategies) > 0,
            "speculative.strategies",
            "a non-empty list like ['4_1_5']",
            self.strategies,
        )
        for s in self.strategies:
            try:
                SpecStrategy.parse(s)
            except ValueError as err:
                hint = " (YAML reads an unquoted 8_4_48 as the integer 8448: quote it, '8_4_48')" if s.isdigit() else ""
                raise ConfigError(f"speculative.strategies: {err}{hint}") from None
        _check(self.threshold >= 1, "speculative.threshold", "an integer >= 1", self.threshold)
        _check(0 <= self.epsilon <= 1, "speculative.epsilon", "a float in [0, 1]", self.epsilon)
        _check(self.window >= 1, "speculative.window", "an integer >= 1", self.window)
        if self.tuner == "fixed":
            _check(
                len(self.strategies) == 1,
                "speculative.strategies",
                "exactly one strategy for tuner 'fixed'",
                self.strategies,
            )
        from tlt.schedulers.tuners.bandits import parse_buckets

        try:
            parse_buckets(self.bucket_bounds)
        except ValueError as err:
            raise ConfigError(f"speculative.buckets: {err}") from None

    @property
    def bucket_bounds(self) -> list[int | str]:
        """`buckets` with the finite bounds as integers (YAML may give them as strings)."""
        return [int(b) if str(b).strip().isdigit() else str(b) for b in self.buckets]


@dataclass
class DrafterConfig:
    # eagle, small_lm, ngram, suffix; or a learned drafter composed with the suffix drafter, chosen per row and
    # step (tlt.drafters.composed): eagle+suffix, small_lm+suffix
    kind: str = "eagle"
    path: str | None = None  # a saved tlt drafter folder to start from
    small_lm_preset: str = "test"  # model preset of the small_lm drafter
    lr: float = 1e-3  # AdamW peak learning rate of drafter training (offline; online too unless online_lr is set)
    batch_tokens: int = 4096  # real tokens sampled per drafter micro-step (a longer sample goes alone)
    # spot: a micro-step runs in chunks of about this many tokens, preemptible between them; small chunks keep
    # the trainer's activations (tokens x vocab logits) out of the cache the decoding ranks share on a CPU
    preempt_tokens: int = 256
    max_epochs_per_step: float = 2.0  # micro-steps per RL step at most this many passes over the buffer's tokens
    online_warmup_steps: int = 20  # online training: linear learning-rate warm-up over this many micro-steps
    # online training's peak learning rate (None: drafter.lr). A drafter distilled offline ends its schedule near
    # zero; restarting it at the distillation peak on one step's rollouts undoes part of that training
    online_lr: float | None = None
    packing: bool = True  # pack samples into rows, per-document attention (False: pad each to the longest)
    buffer_decay: float = 0.5  # data-buffer sampling weight per policy version of age, in (0, 1]
    buffer_long_tokens: int = 256  # samples this long from the previous version are kept (one-step offset)
    w_feature: float = 1.0  # EAGLE-1 SmoothL1 feature-loss weight
    w_token: float = 0.1  # EAGLE-1 soft cross-entropy weight
    # head training forwards (offline and online): 32-true, bf16-mixed (bf16 autocast over fp32 weights), or auto
    precision: str = "32-true"
    train_steps: int = 300  # optimizer steps of `tlt train-drafter` (offline distillation)
    distill_prompts: int = 512  # training prompts the target answers to make distillation data
    distill_max_new_tokens: int = 256  # response budget of those answers (and of the acceptance check)
    distill_temperature: float = 0.0  # 0 = the target's greedy answers, > 0 = sampled ones
    eval_prompts: int = 16  # held-out prompts for the acceptance-length check before / after training
    eval_strategy: str = "4_1_5"  # SD strategy of that check
    # suffix drafter: response tokens kept over all prompts (least-recently-used prompt out first); kept across
    # steps, saved in the checkpoint
    history_tokens: int = 1_000_000
    history_responses: int = 64  # suffix drafter: finished responses kept per prompt (oldest out first)
    # suffix drafter: a draft (a tree: its nodes) is at most this many times the matched context's length (and the
    # strategy's depth, or nodes); larger drafts more after long matches (as DAS does), at more compute per verify
    suffix_spec_factor: float = 1.0
    # suffix drafter: a drafted token must have followed the matched context at least this share of the time
    suffix_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        _check_choice("drafter.kind", self.kind, DRAFTER_KINDS)
        _check(self.history_tokens >= 0, "drafter.history_tokens", "an integer >= 0", self.history_tokens)
        _check(self.history_responses >= 0, "drafter.history_responses", "an integer >= 0", self.history_responses)
        _check(self.suffix_spec_factor > 0, "drafter.suffix_spec_factor", "a float > 0", self.suffix_spec_factor)
        _check(
            0 <= self.suffix_min_token_prob <= 1,
            "drafter.suffix_min_token_prob",
            "a float in [0, 1]",
            self.suffix_min_token_prob,
        )
        _check_choice("drafter.precision", self.precision, PRECISIONS)
        _check(self.train_steps >= 1, "drafter.train_steps", "an integer >= 1", self.train_steps)
        _check(self.distill_prompts >= 1, "drafter.distill_prompts", "an integer >= 1", self.distill_prompts)
        _check(
            self.distill_max_new_tokens >= 2,
            "drafter.distill_max_new_tokens",
            "an integer >= 2",
            self.distill_max_new_tokens,
        )
        _check(
            self.distill_temperature >= 0,
            "drafter.distill_temperature",
            "a float >= 0 (0 = greedy)",
            self.distill_temperature,
        )
        _check(self.eval_prompts >= 1, "drafter.eval_prompts", "an integer >= 1", self.eval_prompts)
        try:
            SpecStrategy.parse(self.eval_strategy)
        except ValueError as err:
            raise ConfigError(f"drafter.eval_strategy: {err}") from None
        _check(0 < self.lr < 1, "drafter.lr", "a float in (0, 1)", self.lr)
        if self.online_lr is not None:
            _check(0 < self.online_lr < 1, "drafter.online_lr", "a float in (0, 1) or null", self.online_lr)
        _check(self.batch_tokens >= 16, "drafter.batch_tokens", "an integer >= 16", self.batch_tokens)
        _check(self.preempt_tokens >= 16, "drafter.preempt_tokens", "an integer >= 16", self.preempt_tokens)
        _check(self.max_epochs_per_step > 0, "drafter.max_epochs_per_step", "a float > 0", self.max_epochs_per_step)
        _check(
            self.online_warmup_steps >= 0, "drafter.online_warmup_steps", "an integer >= 0", self.online_warmup_steps
        )
        _check(0 < self.buffer_decay <= 1, "drafter.buffer_decay", "a float in (0, 1]", self.buffer_decay)
        _check(
            self.buffer_long_tokens >= 1,
            "drafter.buffer_long_tokens",
            "an integer >= 1",
            self.buffer_long_tokens,
        )
        _check(
            self.w_feature >= 0 and self.w_token >= 0,
            "drafter.w_feature/w_token",
            "floats >= 0",
            (self.w_feature, self.w_token),
        )


@dataclass
class SchedulerConfig:
    policy: str = "spot"  # spot (train on idle workers during rollout), between_steps, never
    buffer_bytes: int = 256 * 2**20  # drafter data-buffer bound
    between_steps_budget: int = 8  # between_steps: drafter micro-steps per worker after each rollout
    # spot where no worker is ever idle (one process): drafter micro-steps after the update until they have
    # taken this share of the step's rollout + training seconds (preempted between chunks; 0 = none)
    no_idle_budget: float = 0.05

    def __post_init__(self) -> None:
        _check_choice("scheduler.policy", self.policy, ("spot", "between_steps", "never"))
        _check(0 <= self.no_idle_budget <= 1, "scheduler.no_idle_budget", "a float in [0, 1]", self.no_idle_budget)
        _check(
            self.between_steps_budget >= 1,
            "scheduler.between_steps_budget",
            "an integer >= 1",
            self.between_steps_budget,
        )
        _check(
            self.buffer_bytes >= 2**20,
            "scheduler.buffer_bytes",
            "an integer >= 1 MiB (1048576)",
            self.buffer_bytes,
        )


@dataclass
class GRPOConfig:
    """GRPO policy update (tlt.training.grpo); the group size G is rollout.samples_per_prompt."""

    steps: int = 20  # RL steps
    lr: float = 1e-5  # AdamW, constant
    clip_eps: float = 0.2  # importance ratio clipped to [1 - clip_eps, 1 + clip_eps]
    kl_coef: float = 0.0  # k3 KL to the frozen initial policy (0: no reference model is kept)
    entropy_coef: float = 0.0  # entropy bonus weight
    epochs: int = 1  # passes over each step's rollouts (DeepSeekMath's mu)
    minibatch_size: int = 32  # sequences per optimizer step
    micro_batch_tokens: int = 4096  # padded tokens per forward (length-sorted micro-batches, gradients summed)
    # a forward's fixed cost in tokens, traded against padding (grpo.micro_batches)
    micro_batch_overhead_tokens: int = 64
    scale_rewards: bool = True  # divide group-centred rewards by the group's std (False: Dr. GRPO)
    max_grad_norm: float = 1.0  # gradient-norm clip of the policy update
    weight_decay: float = 0.0  # AdamW weight decay of the policy update
    # recompute and update forwards: 32-true, bf16-mixed (bf16 autocast over fp32 weights; what GPU runs use), or
    # auto (bf16-mixed on CUDA and on CPUs with native bf16, else 32-true)
    precision: str = "32-true"
    # pi_old of the clipped ratio: recompute (a forward of the policy over the rollouts, as verl and TRL do), rollout
    # (the engine's log-probs of the sampled tokens, and the drafter buffer filled from the engine's hidden
    # states: no forward; exact when the engine runs the trainer's weights in the trainer's numerics), or auto
    # (rollout with the native engine and float32 training, else recompute: tlt.training.grpo.old_logprobs_source)
    old_logprobs: str = "recompute"
    # recompute each decoder layer's activations in the backward instead of keeping them (less memory, ~1/3 more
    # forward compute; gradients unchanged): for large policies on GPUs
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "grpo.steps", "an integer >= 1", self.steps)
        _check_choice("grpo.precision", self.precision, PRECISIONS)
        _check_choice("grpo.old_logprobs", self.old_logprobs, ("recompute", "rollout", "auto"))
        _check(0 < self.lr < 1, "grpo.lr", "a float in (0, 1)", self.lr)
        _check(0 < self.clip_eps < 1, "grpo.clip_eps", "a float in (0, 1)", self.clip_eps)
        _check(self.kl_coef >= 0, "grpo.kl_coef", "a float >= 0", self.kl_coef)
        _check(self.entropy_coef >= 0, "grpo.entropy_coef", "a float >= 0", self.entropy_coef)
        _check(self.epochs >= 1, "grpo.epochs", "an integer >= 1", self.epochs)
        _check(self.minibatch_size >= 1, "grpo.minibatch_size", "an integer >= 1", self.minibatch_size)
        _check(self.micro_batch_tokens >= 1, "grpo.micro_batch_tokens", "an integer >= 1", self.micro_batch_tokens)
        _check(
            self.micro_batch_overhead_tokens >= 0,
            "grpo.micro_batch_overhead_tokens",
            "an integer >= 0",
            self.micro_batch_overhead_tokens,
        )
        _check(self.max_grad_norm > 0, "grpo.max_grad_norm", "a float > 0", self.max_grad_norm)
        _check(self.weight_decay >= 0, "grpo.weight_decay", "a float >= 0", self.weight_decay)


@dataclass
class EvalConfig:
    max_new_tokens: int = 768  # long enough for the hardest problems of the default mix
    batch_size: int = 64  # held-out prompts decoded together

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, "eval.max_new_tokens", "an integer >= 1", self.max_new_tokens)
        _check(self.batch_size >= 1, "eval.batch_size", "an integer >= 1", self.batch_size)


@dataclass
class TrainConfig:
    """`tlt train` bookkeeping; the RL step itself is rollout, speculative, drafter, scheduler and grpo."""

    checkpoint_every: int = 10  # RL steps between checkpoints (one is also written after the last step)
    tensorboard: bool = True  # also log per-step metrics to <output_dir>/tensorboard (CSV is always written)
    device: str = "auto"  # auto (cuda when available, else cpu), cpu, cuda
    devices: int = 1  # processes (ranks), one rollout engine each; CPU: spawned by `tlt train`; else torchrun
    bootstrap_if_missing: bool = False  # model.path missing: bootstrap it first (`tlt bootstrap` on this config)
    compare_baseline: bool = False  # then run the same RL with TLT off in <output_dir>/baseline and compare
    # with compare_baseline: the arms take turns of this many steps each (TLT, baseline, TLT, ...: each resumes
    # from its checkpoint), so a machine whose speed drifts over the run slows both alike; 0: TLT's whole run,
    # then the baseline's
    compare_turn_steps: int = 0
    stop_after: int = 0  # stop (with a checkpoint) after this step, to resume later; 0: run all grpo.steps
    warmup_steps: int = 1  # first steps left out of the step-time comparison (engine and allocator warm-up)
    heldout_eval: int = 256  # held-out problems the comparison evaluates base and final policies on (0: none)
    # RL steps between async drafter checkpoints to <output_dir>/drafter_latest (0: off)
    drafter_checkpoint_every: int = 1
    # policy update over processes: replicate (DDP-like) or fsdp (tlt.training.distributed.fsdp)
    sharding: str = "replicate"

    def __post_init__(self) -> None:
        _check_choice("train.device", self.device, ("auto", "cpu", "cuda"))
        _check_choice("train.sharding", self.sharding, ("replicate", "fsdp"))
        _check(self.warmup_steps >= 0, "train.warmup_steps", "an integer >= 0", self.warmup_steps)
        _check(self.compare_turn_steps >= 0, "train.compare_turn_steps", "an integer >= 0", self.compare_turn_steps)
        _check(self.stop_after >= 0, "train.stop_after", "an integer >= 0 (0: all grpo.steps)", self.stop_after)
        _check(self.heldout_eval >= 0, "train.heldout_eval", "an integer >= 0", self.heldout_eval)
        _check(self.devices >= 1, "train.devices", "an integer >= 1", self.devices)
        _check(self.checkpoint_every >= 1, "train.checkpoint_every", "an integer >= 1", self.checkpoint_every)
        _check(
            self.drafter_checkpoint_every >= 0,
            "train.drafter_checkpoint_every",
            "an integer >= 0 (0 = off)",
            self.drafter_checkpoint_every,
        )


@dataclass
class RunConfig:
    output_dir: str = "runs/default"  # checkpoints, metrics.csv, TensorBoard logs and reports of the run
    seed: int = 0  # the run's seed: problem order, rollout sampling, initialisation of fresh models
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    base: list[str] | tuple[str, ...] = (),
) -> RunConfig:
    """Defaults <- `base` overrides (e.g. a preset's) <- YAML file <- `key=value` overrides, validated.

    Raises ConfigError naming the bad key.
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.from_dotlist(list(base)))
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file not found: {path}")
            try:
                merged = OmegaConf.merge(merged, OmegaConf.load(path))
            except yaml.YAMLError as err:
                where = getattr(err, "problem_mark", None)
                line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
                raise ConfigError(f"{path} is not valid YAML{line}: {getattr(err, 'problem', err)}") from None
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not of the form key=value (e.g. rollout.temperature=0.7)")
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(err)) from None


def _omegaconf_message(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or "?"
    first = str(err).splitlines()[0]
    if "Key" in first and "not in" in first:
        return f"unknown config key {key!r} ({first})"
    return f"bad value for config key {key!r}: {first}"


def to_yaml(config: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))

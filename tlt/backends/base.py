"""The rollout-engine contract shared by every backend (native, vllm, sglang)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

# the contract's sampling settings, defined in the leaf math that applies them (re-exported here)
from tlt.files import read_json
from tlt.speculative.sampling import SamplingParams as SamplingParams

if TYPE_CHECKING:
    from tlt.drafters.base import Drafter


class FinishReason(enum.Enum):
    STOP = "stop"  # produced an end-of-sequence token (included in token_ids)
    LENGTH = "length"  # hit max_new_tokens or the engine's context limit


@dataclass
class Rollout:
    """One sampled response."""

    prompt_index: int  # index into the `prompts` list given to generate()
    sample_index: int  # 0..n-1 within its prompt's group
    prompt_ids: torch.Tensor  # [P] int64
    token_ids: torch.Tensor  # [T] int64 response tokens (EOS included when finish_reason is STOP)
    # [T] float32 target log-prob of each token: log_softmax(logits / temperature) (temperature 1 if greedy),
    # before top-k / top-p
    logprobs: torch.Tensor
    finish_reason: FinishReason
    hidden_states: torch.Tensor | None = None  # [T, D] target last-layer hidden state per response token
    prompt_hidden_states: torch.Tensor | None = None  # [P, D] the same at each prompt position (native engine)


@dataclass
class DecodeStepStats:
    """What one decode iteration (plain step or SD draft+verify) did."""

    running_batch: int  # sequences decoding in this iteration
    sd_on: bool
    strategy: str | None  # e.g. "4_1_5" when sd_on
    drafted_tokens: int  # draft nodes verified, summed over the batch (0 when SD is off)
    accepted_tokens: int  # accepted draft tokens, summed over the batch (bonus tokens not counted)
    generated_tokens: int  # tokens appended to sequences this iteration (accepted + one per row)
    seconds: float


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; requests outside this fail with a clear error."""

    per_step_strategy: bool  # SD on/off and the strategy can change every decode step
    drafter_hot_swap: bool  # set_drafter() between generate() calls without restarting the engine
    hidden_states: bool  # generate() can return last-layer hidden states
    tree_drafts: bool  # topk > 1 draft trees
    drafters: tuple[str, ...] = field(default_factory=tuple)  # drafter kinds the backend accepts
    per_step_stats: bool = True  # step_stats has one record per decode iteration (else aggregates per call)


class RolloutEngine(Protocol):
    """Generates rollouts from a target model; see DESIGN.md (contracts)."""

    capabilities: Capabilities
    step_stats: list[DecodeStepStats]  # per decode iteration of the last generate() call (see Capabilities)
    drafter: Drafter | None
    weights_version: int | None  # the version of the last update_weights()

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, n: int = 1) -> list[Rollout]: ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None: ...

    def check_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Raise unless update_weights(state_dict) would succeed; changes nothing."""
        ...

    def set_drafter(self, drafter: Drafter | None) -> None: ...

    def check_drafter(self, drafter: Drafter | None) -> None:
        """Raise unless set_drafter(drafter) would succeed; changes nothing the engine runs."""
        ...

    def close(self) -> None:
        """Release the engine's processes and files (vLLM / SGLang run in their own processes)."""
        ...


def import_optional(module: str, hint: str):
    """Import an optional backend package, or raise an ImportError carrying the install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{hint} ({err})") from None


def check_prompts(
    prompts: Sequence[Sequence[int]], max_seq_len: int, truncate: str | None, max_new_tokens: int = 1
) -> list[list[int]]:
    """Prompts as lists of ints: none may be empty; one longer than max_seq_len - 1 (one slot is left for a
    generated token) raises. With `truncate` "left", a prompt that leaves fewer than `max_new_tokens` slots
    keeps its last max_seq_len - max_new_tokens tokens, so every response gets its whole budget (a clear
    error when max_new_tokens leaves no room for a prompt at all)."""
    limit, room = max_seq_len - 1, max_seq_len - max_new_tokens
    out = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if len(ids) > limit and truncate != "left":
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens, more than the engine limit of {limit} "
                f"(max_seq_len={max_seq_len} minus one generated token); shorten it or build the engine "
                "with truncate_prompts='left'"
            )
        if len(ids) > room and truncate == "left":
            if room < 1:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens and max_new_tokens={max_new_tokens} leaves no room for it "
                    f"in max_seq_len={max_seq_len}: left truncation keeps max_seq_len - max_new_tokens tokens; "
                    "raise max_seq_len or lower max_new_tokens"
                )
            ids = ids[-room:]
        out.append(ids)
    return out


@dataclass(frozen=True)
class TargetShapes:
    """Names and shapes of a target's checkpoint tensors, read from its HF folder without building the model
    (what folder-based engines check weight updates and drafters against)."""

    shapes: dict[str, tuple[int, ...]]
    tied: frozenset[str]  # names a state dict may hold that the checkpoint omits (a tied LM head)
    hidden_size: int
    vocab_size: int
    max_positions: int

    @classmethod
    def read(cls, folder: Path) -> TargetShapes:
        from safetensors import safe_open

        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json)")
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{folder} has no *.safetensors weights (save it with save_pretrained)")
        shapes = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
        config = read_json(folder / "config.json")
        tied = frozenset({"lm_head.weight"} if config.get("tie_word_embeddings") else ())
        return cls(
            shapes, tied, config["hidden_size"], config["vocab_size"], config.get("max_position_embeddings", 2048)
        )

    def check(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Raise (KeyError / ValueError) unless every name and shape of `state_dict` fits."""
        unknown = sorted(set(state_dict) - set(self.shapes) - self.tied)
        if unknown:
            raise KeyError(
                f"update_weights: unknown parameter names {unknown[:5]}; expected HF names like "
                f"{next(iter(self.shapes))!r}"
            )
        bad = [
            f"{k}: got {tuple(v.shape)}, model has {self.shapes[k]}"
            for k, v in state_dict.items()
            if k in self.shapes and tuple(v.shape) != self.shapes[k]
        ]
        if bad:
            raise ValueError(f"update_weights: shape mismatch, nothing was loaded: {'; '.join(bad[:5])}")

    def check_drafter(self, drafter: Drafter) -> None:
        """Raise DrafterMismatchError unless an EAGLE drafter's hidden and vocabulary sizes are the target's."""
        from tlt.drafters.base import DrafterMismatchError

        cfg = drafter.config
        if (cfg.hidden_size, cfg.vocab_size) != (self.hidden_size, self.vocab_size):
            raise DrafterMismatchError(
                f"EAGLE drafter was built for hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size} but the "
                f"target has hidden_size={self.hidden_size}, vocab_size={self.vocab_size}; train a drafter for "
                "this target (tlt train-drafter)"
            )


def call_stats(
    strategy: str | None, verifies: int, drafted: int, accepted: int, samples: int, tokens: int, seconds: float
) -> list[DecodeStepStats]:
    """`step_stats` of an engine without per-iteration records: one aggregate of the call's SD verifies (a
    record per verify and row; each commits its accepted drafts plus one token) and one of the rest, the
    seconds split by token share."""
    sd_tokens = verifies + accepted
    share = sd_tokens / tokens if tokens else 0.0
    stats = []
    if verifies:
        stats.append(DecodeStepStats(verifies, True, strategy, drafted, accepted, sd_tokens, seconds * share))
    stats.append(DecodeStepStats(samples, False, None, 0, 0, tokens - sd_tokens, seconds * (1 - share)))
    return stats


class UnsupportedFeatureError(RuntimeError):
    """Raised when a backend is asked for something its Capabilities exclude."""

"""The drafter contract: how the engine drives a drafter through one batch of sequences.

State convention (per row): the drafter has seen the committed tokens x_1..x_T; the target hidden state of the last
token x_T is not known yet (the target has not run on it). Every `append` delivers pairs (h_{i}, x_{i+1}): the
target's last-layer hidden state that predicted a token, and the token. `propose` drafts a tree whose root is x_T.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

if TYPE_CHECKING:
    from tlt.config import DrafterConfig
    from tlt.speculative.sampling import SamplingParams


class DrafterMismatchError(ValueError):
    """A drafter does not fit its target (vocabulary, hidden size, ...)."""


class Drafter(ABC):
    kind: str  # registry name: "eagle", "small_lm", "ngram", "suffix"
    uses_target_hidden: bool  # whether append/start need the target's hidden states
    version: int | None = None  # policy version it was pushed to an engine with (tlt.training.weight_push)

    @abstractmethod
    def bind(self, target: torch.nn.Module) -> None:
        """Attach to a target model (an HF causal LM); raise DrafterMismatchError if shapes do not fit.

        EAGLE shares (never copies back over) the target's token embedding and LM head here.
        """

    @abstractmethod
    def start(self, tokens: torch.Tensor, hidden: torch.Tensor | None, lengths: torch.Tensor) -> None:
        """Begin a batch from its prompts.

        tokens: [B, T] int64, right-padded; lengths: [B] int64 valid prompt lengths.
        hidden: [B, T, D] target last-layer hidden state of each prompt token (aligned with tokens), or None.
        Pairs (hidden[b, j], tokens[b, j + 1]) for j < lengths[b] - 1 are consumed; hidden[b, lengths[b] - 1]
        arrives again with the first `append`.
        """

    @abstractmethod
    def append(self, tokens: torch.Tensor, prev_hidden: torch.Tensor | None, counts: torch.Tensor) -> None:
        """Commit new tokens: row b gets tokens[b, :counts[b]].

        tokens: [B, L] int64; counts: [B] int64 in 1..L.
        prev_hidden: [B, L, D], prev_hidden[b, j] is the target hidden state at the position preceding
        tokens[b, j] (the one whose logits produced it), or None when the drafter does not use hidden states.
        Anything speculative left by the last `propose` beyond the committed tokens is discarded.
        """

    @abstractmethod
    def propose(self, strategy: SpecStrategy) -> DraftTree:
        """Draft a tree per row, rooted at its last committed token, with strategy.verify_tokens nodes."""

    def propose_sampled(
        self, strategy: SpecStrategy, sampling: SamplingParams, generator: torch.Generator | None
    ) -> DraftTree:
        """Draft for a sampled (temperature > 0) decode step; by default the same tree as `propose`.

        A drafter that can sample a chain from a distribution q it knows returns q in `DraftTree.draft_probs`
        (q after the step's temperature / top-k / top-p, drawn with `generator`): the engine then verifies
        with min(1, p / q), which accepts a draft with probability ~1 - TV(p, q) instead of p(draft), far
        more when the target's distribution is flat and the drafter matches it.
        """
        return self.propose(strategy)

    @abstractmethod
    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows, in this order ([B'] int64), e.g. when sequences finish."""

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the drafter (weights + config) to a folder, atomically."""

    @classmethod
    def from_config(cls, cfg: DrafterConfig, target: torch.nn.Module, seed: int = 0) -> Drafter:
        """A fresh drafter for `target` from the run config's drafter section (`tlt train` without
        drafter.path). Model-free drafters take their settings; trained ones start untrained."""
        return cls()

    def clone(self) -> Drafter:
        """An independent copy of the drafter's own weights (bind it before use); training the original
        afterwards leaves the copy alone."""
        return copy.deepcopy(self)

    def for_engine(self) -> Drafter:
        """What a weight push installs in an engine: a clone of trained weights, so later training leaves the
        engine's copy alone. State that the engine itself feeds (the suffix drafter's history) is shared
        instead, so the trainer's drafter, and its checkpoint, is the one that saw the rollouts."""
        return self.clone()

    def probe(self) -> Drafter:
        """A drafter `for_engine()` returned, as a push dry-runs it: itself, or a copy without the state it
        shares (a dry run must not write into the shared history)."""
        return self


DRY_RUN_STRATEGY = SpecStrategy(steps=1, topk=1, verify_tokens=2)


@torch.inference_mode()
def dry_run(drafter: Drafter, target: torch.nn.Module) -> None:
    """start + propose on one 2-token prompt (zero features) against `target` (the drafter is bound to it);
    raises DrafterMismatchError when the draft has the wrong shape or token ids outside the vocabulary."""
    weight = target.get_input_embeddings().weight
    device, D = weight.device, target.config.hidden_size
    tokens = torch.zeros(1, 2, dtype=torch.long, device=device)  # [B, T]
    hidden = torch.zeros(1, 2, D, dtype=weight.dtype, device=device) if drafter.uses_target_hidden else None
    drafter.start(tokens, hidden, torch.tensor([2], device=device))  # hidden: [B, T, D] or None
    tree = drafter.propose(DRY_RUN_STRATEGY)
    vocab, shape = target.config.vocab_size, tuple(tree.tokens.shape)
    in_vocab = bool(((tree.tokens >= 0) & (tree.tokens < vocab)).all())
    if shape != (1, DRY_RUN_STRATEGY.verify_tokens) or not in_vocab:
        raise DrafterMismatchError(
            f"drafter {type(drafter).__name__} drafted {tree.tokens.tolist()} (shape {shape}) on a dry run; "
            f"expected shape (1, {DRY_RUN_STRATEGY.verify_tokens}) with token ids in [0, {vocab})"
        )

"""The one definition of "the distribution the target samples from", shared by plain decoding and SD.

Order of operations (as in vLLM / HF): temperature, then top-k, then top-p on the top-k-renormalised
distribution. Greedy (temperature 0) is the one-hot at argmax (lowest index on ties, like torch.argmax);
top-k / top-p are ignored then. Ties inside top-k and top-p are broken by the lowest token index, so the kept
set is always exactly defined.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature == 0 means greedy (top_p / top_k are then ignored)."""

    temperature: float = 1.0
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 256
    seed: int | None = None  # seeds the engine's torch.Generator for this call

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _greedy_logits(logits: torch.Tensor) -> torch.Tensor:
    """[.., V] 0 at argmax (lowest index on ties), -inf elsewhere."""
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, logits.argmax(dim=-1, keepdim=True), 0.0)


def _sorted_keep_mask(sorted_logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[.., V] bool over descending-sorted logits: which ranks survive top-k then top-p."""
    V = sorted_logits.shape[-1]
    ranks = torch.arange(V, device=sorted_logits.device)
    keep = ranks < top_k if 0 < top_k < V else torch.ones(V, dtype=torch.bool, device=sorted_logits.device)
    keep = keep.expand_as(sorted_logits)
    if top_p < 1.0:
        probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)  # [.., V]
        mass_before = probs.cumsum(dim=-1) - probs  # exclusive cumsum; rank 0 always has 0 < top_p
        keep = keep & (mass_before < top_p)
    return keep


def processed_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[.., V] logits after temperature, top-k and top-p; filtered entries are -inf.

    Top-p keeps the smallest prefix of the descending distribution whose mass is >= top_p (at least one
    token).
    Greedy returns 0 at the argmax and -inf elsewhere, so `softmax` of the result is the greedy one-hot.
    """
    if params.greedy:
        return _greedy_logits(logits)
    scaled = logits / params.temperature
    V = scaled.shape[-1]
    if not (0 < params.top_k < V) and params.top_p >= 1.0:
        return scaled
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # [.., V]
    keep_sorted = _sorted_keep_mask(sorted_logits, params.top_k, params.top_p)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to vocabulary order
    return scaled.masked_fill(~keep, float("-inf"))


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[.., V] float32: exactly the distribution the engine samples the next token from."""
    return torch.softmax(processed_logits(logits.float(), params), dim=-1)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] probabilities -> [B] int64 tokens, one draw per row.

    Inverse-CDF sampling with one uniform per row: token i is drawn when u * total falls in (cum_{i-1},
    cum_i] of the row's cumulative sums, u in (0, 1], so zero-probability tokens are never drawn and rows
    need not be normalised. No host sync; deterministic for a given generator state. Five small ops: on a CPU
    `torch.multinomial` (an exponential race over the vocabulary) took 3-9x as long per call.
    """
    if probs.dim() != 2:
        raise ValueError(f"sample_tokens expects probs of shape [B, V], got {tuple(probs.shape)}")
    cum = probs.float().cumsum(dim=-1)  # [B, V]
    u = 1.0 - torch.rand(probs.shape[0], 1, generator=generator, device=probs.device)  # [B, 1] in (0, 1]
    return torch.searchsorted(cum, u * cum[:, -1:]).squeeze(-1).clamp(max=probs.shape[1] - 1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..] log_softmax(logits / T) at `tokens`, T = temperature (1 when greedy), before top-k / top-p.

    This is the `Rollout.logprobs` contract: the RL loss needs the policy's tempered log-probs, not the
    truncated sampling distribution (whose log-prob is -inf outside the nucleus).
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"token_logprobs: logits {tuple(logits.shape)} must have the shape of tokens "
            f"{tuple(tokens.shape)} plus a vocab dim"
        )
    temperature = 1.0 if params.greedy else params.temperature
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [.., V]
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

"""Sequence state of the native engine: the running batch, per-sequence output buffers, and the stop rules.

Row convention: the KV cache of a running row holds every committed token except the last one (`pending`),
whose K/V the next forward computes. A row's total length is cache_len + 1 = prompt + generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tlt.backends.base import FinishReason, Rollout


@dataclass
class RunningBatch:
    """The rows decoding now; row i of every tensor is the same sequence."""

    seq_ids: torch.Tensor  # [B] int64 sequence index (prompt_index * n + sample_index)
    cache_lens: torch.Tensor  # [B] int64 tokens whose K/V are cached
    pending: torch.Tensor  # [B] int64 last committed token (K/V not cached yet)
    remaining: torch.Tensor  # [B] int64 tokens the row may still emit (max_new_tokens and context limit)

    @property
    def size(self) -> int:
        return self.seq_ids.shape[0]

    def keep(self, rows: torch.Tensor) -> RunningBatch:
        return RunningBatch(
            seq_ids=self.seq_ids[rows],
            cache_lens=self.cache_lens[rows],
            pending=self.pending[rows],
            remaining=self.remaining[rows],
        )


@dataclass
class Emission:
    """Tokens one decode iteration appends to each running row."""

    tokens: torch.Tensor  # [B, L] int64, row b valid up to counts[b] (padding is a valid token id)
    counts: torch.Tensor  # [B] int64 in 1..L
    logprobs: torch.Tensor  # [B, L] float32 target log-prob of each token
    prev_hidden: torch.Tensor  # [B, L, D] hidden state of the position that produced each token


@dataclass
class StopCheck:
    counts: torch.Tensor  # [B] int64 tokens kept after the EOS / budget cut, >= 1
    stopped: torch.Tensor  # [B] bool the kept tokens end with EOS
    finished: torch.Tensor  # [B] bool the row leaves the batch (EOS or no budget left)


def check_stop(tokens: torch.Tensor, counts: torch.Tensor, remaining: torch.Tensor, eos: int | None) -> StopCheck:
    """Cut each row's emitted tokens [B, L] at its first EOS (kept) and at its remaining budget [B]."""
    L = tokens.shape[1]
    steps = torch.arange(L, device=tokens.device)[None, :]  # [1, L]
    if eos is None:
        is_eos = torch.zeros_like(tokens, dtype=torch.bool)
    else:
        is_eos = (tokens == eos) & (steps < counts[:, None])  # [B, L]
    has_eos = is_eos.any(dim=1)
    eos_end = torch.where(has_eos, is_eos.int().argmax(dim=1) + 1, L + 1)  # tokens up to and including EOS
    kept = torch.minimum(torch.minimum(counts, eos_end), remaining)
    stopped = has_eos & (eos_end <= kept)
    return StopCheck(counts=kept, stopped=stopped, finished=stopped | (kept >= remaining))


@dataclass
class Outputs:
    """Per-sequence buffers of one generate() call; column W - 1 is scratch for the padding of an emission."""

    tokens: torch.Tensor  # [R, W] int64
    logprobs: torch.Tensor  # [R, W] float32
    hidden: torch.Tensor | None  # [R, W, D] prev-position hidden state of each token
    lengths: torch.Tensor  # [R] int64 tokens generated so far
    stopped: torch.Tensor  # [R] bool ended with EOS
    prompt_hidden: torch.Tensor | None = None  # [P, T, D] each prompt's hidden states (set by the prefill)

    @staticmethod
    def allocate(num_seqs: int, max_new_tokens: int, hidden_size: int | None, device) -> Outputs:
        W = max_new_tokens + 1
        hidden = None if hidden_size is None else torch.zeros(num_seqs, W, hidden_size, device=device)
        return Outputs(
            tokens=torch.zeros(num_seqs, W, dtype=torch.long, device=device),
            logprobs=torch.zeros(num_seqs, W, device=device),
            hidden=hidden,
            lengths=torch.zeros(num_seqs, dtype=torch.long, device=device),
            stopped=torch.zeros(num_seqs, dtype=torch.bool, device=device),
        )

    def write(self, seq_ids: torch.Tensor, emission: Emission, stop: StopCheck) -> None:
        """Append emission.tokens[b, :stop.counts[b]] to sequence seq_ids[b] without a host sync.

        All L columns are written; those past the kept count land beyond the row's length (overwritten later
        or ignored), and columns past the buffer are clamped onto the scratch column.
        """
        L = emission.tokens.shape[1]
        W = self.tokens.shape[1]
        cols = (self.lengths[seq_ids][:, None] + torch.arange(L, device=seq_ids.device)).clamp(max=W - 1)
        rows = seq_ids[:, None].expand(-1, L)  # [B, L]
        self.tokens[rows, cols] = emission.tokens
        self.logprobs[rows, cols] = emission.logprobs.float()
        if self.hidden is not None:
            self.hidden[rows, cols] = emission.prev_hidden.to(self.hidden.dtype)
        self.lengths[seq_ids] += stop.counts
        self.stopped[seq_ids] = stop.stopped

    def _prompt_hidden(self, prompt: int, length: int) -> torch.Tensor | None:
        if self.hidden is None or self.prompt_hidden is None:
            return None
        return self.prompt_hidden[prompt, :length].to(self.hidden.dtype)  # a view: the n samples share it

    def rollouts(self, prompts: list[torch.Tensor], n: int) -> list[Rollout]:
        lengths, stopped = self.lengths.tolist(), self.stopped.tolist()
        out = []
        for seq, (length, stop) in enumerate(zip(lengths, stopped, strict=True)):
            out.append(
                Rollout(
                    prompt_index=seq // n,
                    sample_index=seq % n,
                    prompt_ids=prompts[seq // n],
                    token_ids=self.tokens[seq, :length].clone(),
                    logprobs=self.logprobs[seq, :length].clone(),
                    finish_reason=FinishReason.STOP if stop else FinishReason.LENGTH,
                    hidden_states=None if self.hidden is None else self.hidden[seq, :length].clone(),
                    prompt_hidden_states=self._prompt_hidden(seq // n, prompts[seq // n].numel()),
                )
            )
        return out

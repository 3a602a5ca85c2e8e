"""The drafter's online data buffer: the target's own features of recent rollouts, bounded in bytes.

The trainer's log-prob recomputation yields the policy's last-layer (post final norm) hidden states of every
rollout; `add_from_forward` strips the padding and stores one `DrafterSample` per row. The buffer keeps at
most `max_bytes` of tensor data, evicting the oldest samples first. Sampling favours recent policies
(weight `decay ** (current_version - version)`) and implements TLT's "one-step offset" (Hu et al., 2025,
https://arxiv.org/abs/2511.16665, sec. 4.2): while the current step's long tail is still decoding, the
drafter keeps seeing the previous step's long samples, so long samples of the previous version are weighted
like current ones and are evicted only after every other sample of older versions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DrafterSample:
    """One sequence with the target's features; pairs (x_{i+1}, h_i) -> h_{i+1} are formed at packing time."""

    tokens: torch.Tensor  # [T] int64 x_0..x_{T-1}
    hidden: torch.Tensor  # [T, D] h_i, the target's post-final-norm feature at x_i
    loss_mask: torch.Tensor  # [T] bool, x_i is a response token (pair i - 1 is trained)
    version: int  # policy version that produced `hidden`

    def __post_init__(self) -> None:
        T = self.tokens.shape[0]
        if self.tokens.dim() != 1 or self.hidden.dim() != 2 or self.hidden.shape[0] != T:
            raise ValueError(
                f"DrafterSample needs tokens [T] and hidden [T, D]; got {tuple(self.tokens.shape)} and "
                f"{tuple(self.hidden.shape)}"
            )
        if self.loss_mask.shape != (T,) or self.loss_mask.dtype != torch.bool:
            raise ValueError(f"DrafterSample.loss_mask must be a [T] bool tensor, got {self.loss_mask!r}")

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

    @staticmethod
    def from_rollout(rollout, version: int) -> DrafterSample | None:
        """A sample of a rollout that carries the engine's hidden states (`Rollout.prompt_hidden_states` and
        `hidden_states`, native engine with return_hidden): prompt + response minus the last token, whose
        feature the engine never computes; None when no pair would carry loss (a one-token response)."""
        if rollout.hidden_states is None or rollout.prompt_hidden_states is None:
            raise ValueError("DrafterSample.from_rollout needs a rollout with hidden states (return_hidden=True)")
        P = rollout.prompt_ids.numel()
        if rollout.token_ids.numel() < 2:
            return None
        tokens = torch.cat([rollout.prompt_ids, rollout.token_ids[:-1]])  # [P + R - 1]
        hidden = torch.cat([rollout.prompt_hidden_states[: P - 1], rollout.hidden_states])  # [P - 1 + R, D]
        loss_mask = torch.arange(tokens.numel(), device=tokens.device) >= P
        return DrafterSample(tokens, hidden.float(), loss_mask, version)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.hidden.nbytes + self.loss_mask.nbytes


class DrafterBuffer:
    """Byte-bounded store of `DrafterSample`s with seeded, recency-weighted sampling.

    Args:
        max_bytes: bound on the summed tensor bytes of the stored samples.
        decay: sampling weight factor per policy version of age, in (0, 1]; 1 = uniform.
        long_tokens: samples of at least this many tokens count as long (one-step offset).
        seed: seed of the sampling generator.
        device: where samples are stored (a copy is always made, so no view keeps a forward batch alive).
    """

    def __init__(self, max_bytes: int, decay: float = 0.5, long_tokens: int = 256, seed: int = 0, device="cpu"):
        if max_bytes < 1:
            raise ValueError(f"DrafterBuffer.max_bytes must be >= 1, got {max_bytes}")
        if not 0 < decay <= 1:
            raise ValueError(f"DrafterBuffer.decay must be in (0, 1], got {decay}")
        self.max_bytes, self.decay, self.long_tokens = max_bytes, decay, long_tokens
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self.samples: list[DrafterSample] = []  # insertion order, oldest first
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    @property
    def latest_version(self) -> int | None:
        return max((s.version for s in self.samples), default=None)

    def add(self, samples: list[DrafterSample]) -> None:
        """Store copies of `samples` (all or none), then evict down to the byte bound."""
        for s in samples:
            if s.nbytes > self.max_bytes:
                raise ValueError(
                    f"a drafter sample of {s.num_tokens} tokens takes {s.nbytes} bytes, more than the whole "
                    f"buffer bound max_bytes={self.max_bytes}; raise the bound (scheduler.buffer_bytes)"
                )
        for s in samples:
            stored = DrafterSample(
                s.tokens.to(self.device, torch.long, copy=True),
                s.hidden.detach().to(self.device, copy=True),
                s.loss_mask.to(self.device, copy=True),
                int(s.version),
            )
            self.samples.append(stored)
            self.nbytes += stored.nbytes
        self._evict()

    @torch.no_grad()
    def add_from_forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor,
        response_mask: torch.Tensor,
        version: int,
    ) -> int:
        """Store the rows of a padded log-prob forward; returns how many samples were added.

        input_ids: [B, T]; hidden: [B, T, D] last-layer post-norm states aligned with input_ids;
        attention_mask: [B, T] (1 = real token; left, right or any padding); response_mask: [B, T] (1 =
        response token). Padding positions are dropped, keeping tokens and states aligned. Rows without a
        trainable pair (no response token after the first real one) are skipped.
        """
        if hidden.shape[:2] != input_ids.shape or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"add_from_forward needs input_ids [B, T], hidden [B, T, D], attention_mask [B, T]; got "
                f"{tuple(input_ids.shape)}, {tuple(hidden.shape)}, {tuple(attention_mask.shape)}"
            )
        real = attention_mask.bool()  # [B, T]
        trained = response_mask.bool() & real
        samples = []
        for b in range(input_ids.shape[0]):
            keep = real[b].nonzero().squeeze(1)  # [T_b] positions of real tokens, in order
            loss_mask = trained[b, keep]
            if loss_mask[1:].any():
                samples.append(DrafterSample(input_ids[b, keep], hidden[b, keep], loss_mask, version))
        self.add(samples)
        return len(samples)

    def weights(self, current_version: int | None = None) -> torch.Tensor:
        """[N] float64 weights decay ** age; long samples of the previous version count as current."""
        current = self.latest_version if current_version is None else current_version
        ages = torch.tensor([max(0, current - s.version) for s in self.samples], dtype=torch.float64)
        ages = torch.where(self._offset_mask(current), 0.0, ages)
        return self.decay**ages

    def sample(self, num_tokens: int, current_version: int | None = None) -> list[DrafterSample]:
        """Draw samples without replacement, by weight, while their tokens fit in `num_tokens` (at least one).

        Weighted order by Efraimidis-Spirakis keys u ** (1 / w); the first draw is sample i with probability
        w_i / sum(w). The draw stops at the first sample that does not fit.
        """
        if not self.samples:
            raise RuntimeError("the drafter buffer is empty: add rollouts before training the drafter")
        u = torch.rand(len(self.samples), generator=self.generator, dtype=torch.float64)
        keys = u.log() / self.weights(current_version)  # log of u ** (1 / w), larger first
        chosen, total = [], 0
        for i in keys.argsort(descending=True).tolist():
            n = self.samples[i].num_tokens
            if chosen and total + n > num_tokens:
                break
            chosen.append(self.samples[i])
            total += n
        return chosen

    def state_dict(self) -> dict:
        return {
            "samples": [
                {"tokens": s.tokens, "hidden": s.hidden, "loss_mask": s.loss_mask, "version": s.version}
                for s in self.samples
            ],
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents (evicting down to this buffer's bound) and the sampling generator's state."""
        self.samples, self.nbytes = [], 0
        self.add([DrafterSample(**s) for s in state["samples"]])
        self.generator.set_state(state["generator"])

    def _offset_mask(self, current: int) -> torch.Tensor:
        """[N] bool: long samples of the version just before `current` (TLT's one-step offset)."""
        return torch.tensor(
            [s.version == current - 1 and s.num_tokens >= self.long_tokens for s in self.samples],
            dtype=torch.bool,
        )

    def _evict(self) -> None:
        """Oldest first, but long samples of the previous version go after all other older samples."""
        if self.nbytes <= self.max_bytes:
            return
        latest = self.latest_version
        offset = self._offset_mask(latest).tolist()
        rank = [2 if s.version >= latest else int(o) for s, o in zip(self.samples, offset, strict=True)]
        order = sorted(range(len(self.samples)), key=lambda i: (rank[i], i))
        drop = set()
        for i in order:
            if self.nbytes <= self.max_bytes:
                break
            drop.add(i)
            self.nbytes -= self.samples[i].nbytes
        self.samples = [s for i, s in enumerate(self.samples) if i not in drop]

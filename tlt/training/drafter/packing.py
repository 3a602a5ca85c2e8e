"""Batches of drafter samples: sequence packing (first-fit) or padding, and the EAGLE pair shift.

Both layouts give a `PackedBatch`; `PackedBatch.pairs()` forms the EAGLE training pairs: the input at
position i is (embed(x_{i+1}), h_i) and its target h_{i+1}. A pair exists only where positions i and i + 1
belong to the same document, so the shift never crosses a packed boundary, and the head attends only within
a document (`EagleHead.train_forward` with `document_ids`). Positions restart at 0 in every document, so a
packed sample gives exactly the outputs it gives alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tlt.training.drafter.buffer import DrafterSample

PAD_DOCUMENT = -1  # document id of padding positions


@dataclass
class EaglePairs:
    """Training pairs of a PackedBatch (views, no copies); pair i sits at the position of h_i."""

    tokens: torch.Tensor  # [B, L - 1] int64 x_{i+1}
    hidden: torch.Tensor  # [B, L - 1, D] h_i
    target: torch.Tensor  # [B, L - 1, D] h_{i+1}
    position_ids: torch.Tensor  # [B, L - 1] position of h_i in its document
    document_ids: torch.Tensor  # [B, L - 1] document of h_i
    loss_mask: torch.Tensor  # [B, L - 1] bool: x_{i+1} is a response token of h_i's document


@dataclass
class PackedBatch:
    """Rows of whole samples, each sample one document (its index in the list given to pack / pad)."""

    tokens: torch.Tensor  # [B, L] int64 x_i, 0 at padding
    hidden: torch.Tensor  # [B, L, D] h_i, 0 at padding
    loss_mask: torch.Tensor  # [B, L] bool, x_i is a response token; False at padding
    position_ids: torch.Tensor  # [B, L] int64, 0 at each document's first token, 0 at padding
    document_ids: torch.Tensor  # [B, L] int64 sample index, PAD_DOCUMENT at padding

    def pairs(self) -> EaglePairs:
        same_doc = self.document_ids[:, 1:] == self.document_ids[:, :-1]  # [B, L - 1]
        return EaglePairs(
            tokens=self.tokens[:, 1:],
            hidden=self.hidden[:, :-1],
            target=self.hidden[:, 1:],
            position_ids=self.position_ids[:, :-1],
            document_ids=self.document_ids[:, :-1],
            loss_mask=self.loss_mask[:, 1:] & same_doc,
        )

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(**{name: t.to(device, non_blocking=True) for name, t in vars(self).items()})

    def row_chunks(self, max_tokens: int) -> list[PackedBatch]:
        """The rows in consecutive groups of at most max_tokens padded tokens (at least one row per group),
        each group cut to its longest row. Rows are independent (attention and pairs stay within a row), so
        per-token losses summed over the groups are those of the whole batch."""
        B, L = self.tokens.shape
        per = max(1, max_tokens // max(L, 1))
        return [self._rows(slice(i, i + per)) for i in range(0, B, per)]

    def _rows(self, index: slice) -> PackedBatch:
        used = max(1, int((self.document_ids[index] != PAD_DOCUMENT).sum(1).max()))  # rows fill from position 0
        return PackedBatch(**{name: t[index, :used] for name, t in vars(self).items()})

    @property
    def num_loss_tokens(self) -> int:
        """Pairs that carry loss (response tokens with a known target in the same document)."""
        return int(self.pairs().loss_mask.sum())


def first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Bins (index lists) of at most max_tokens tokens: longest first, each into the first bin with room."""
    too_long = [n for n in lengths if n > max_tokens]
    if too_long:
        raise ValueError(
            f"a sample of {max(too_long)} tokens does not fit a packed row of max_tokens={max_tokens}; "
            "pack with max_tokens >= the longest sample"
        )
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        b = next((b for b, r in enumerate(room) if r >= lengths[i]), None)
        if b is None:
            bins.append([])
            room.append(max_tokens)
            b = len(bins) - 1
        bins[b].append(i)
        room[b] -= lengths[i]
    return bins


def pack(samples: list[DrafterSample], max_tokens: int | None = None) -> PackedBatch:
    """Pack samples into rows of at most max_tokens tokens (first-fit decreasing); L = the fullest row.

    max_tokens None: rows as long as the longest sample. The head attends over whole rows under a
    per-document mask, so attention costs about (real tokens) x L: short rows keep it low.
    """
    lengths = [s.num_tokens for s in samples]
    return _layout(samples, first_fit(lengths, max(lengths, default=1) if max_tokens is None else max_tokens))


def pad(samples: list[DrafterSample]) -> PackedBatch:
    """One sample per row, right-padded to the longest (the unpacked layout)."""
    return _layout(samples, [[i] for i in range(len(samples))])


def _layout(samples: list[DrafterSample], rows: list[list[int]]) -> PackedBatch:
    if not samples:
        raise ValueError("cannot batch an empty list of drafter samples")
    L = max(sum(samples[i].num_tokens for i in row) for row in rows)
    B, D, first = len(rows), samples[0].hidden.shape[1], samples[0].hidden
    tokens = torch.zeros(B, L, dtype=torch.long, device=first.device)
    hidden = torch.zeros(B, L, D, dtype=first.dtype, device=first.device)
    loss_mask = torch.zeros(B, L, dtype=torch.bool, device=first.device)
    position_ids = torch.zeros(B, L, dtype=torch.long, device=first.device)
    document_ids = torch.full((B, L), PAD_DOCUMENT, dtype=torch.long, device=first.device)
    for b, row in enumerate(rows):
        start = 0
        for i in row:
            s, end = samples[i], start + samples[i].num_tokens
            tokens[b, start:end], hidden[b, start:end] = s.tokens, s.hidden
            loss_mask[b, start:end] = s.loss_mask
            position_ids[b, start:end] = torch.arange(s.num_tokens, device=first.device)
            document_ids[b, start:end] = i
            start = end
    return PackedBatch(tokens, hidden, loss_mask, position_ids, document_ids)

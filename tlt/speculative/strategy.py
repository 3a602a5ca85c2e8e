"""Speculative-decoding strategies: the `steps_topk_verifytokens` triple of TLT / SGLang EAGLE.

This module imports nothing heavy (no torch), so tuners and configs can use it freely.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SpecStrategy:
    """One SD strategy.

    Attributes:
        steps: draft depth K (how many levels the drafter proposes).
        topk: branching per level (1 gives a chain).
        verify_tokens: tree nodes verified in one target forward, *including the root* (the last committed
            token), as in SGLang's `speculative_num_draft_tokens`. A chain of K drafted tokens is `K_1_{K+1}`.
    """

    steps: int
    topk: int
    verify_tokens: int

    def __post_init__(self) -> None:
        for name in ("steps", "topk", "verify_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SpecStrategy.{name} must be a positive integer, got {value!r}")
        if self.verify_tokens < 2:
            raise ValueError(f"SpecStrategy.verify_tokens must be >= 2 (root + at least one draft), got {self}")
        if self.verify_tokens > self.max_verify_tokens:
            raise ValueError(
                f"strategy {self}: verify_tokens={self.verify_tokens} exceeds the {self.max_verify_tokens} nodes "
                f"a depth-{self.steps}, top-{self.topk} draft tree can hold (1 + topk + (steps - 1) * topk^2)"
            )

    @property
    def max_verify_tokens(self) -> int:
        """Largest tree an EAGLE-2 style beam draft can produce: root + topk + (steps - 1) * topk^2."""
        return 1 + self.topk + (self.steps - 1) * self.topk * self.topk

    @property
    def num_draft_tokens(self) -> int:
        """Drafted nodes (excluding the root)."""
        return self.verify_tokens - 1

    @classmethod
    def parse(cls, text: str | SpecStrategy) -> SpecStrategy:
        """Parse `"8_4_48"` (steps_topk_verifytokens)."""
        if isinstance(text, SpecStrategy):
            return text
        parts = str(text).strip().split("_")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"invalid SD strategy {text!r}: expected 'steps_topk_verifytokens' with three positive integers, "
                "e.g. '4_1_5' (a 4-token chain) or '8_4_48' (depth 8, top-4, 48 verified nodes)"
            )
        return cls(*(int(p) for p in parts))

    def __str__(self) -> str:
        return f"{self.steps}_{self.topk}_{self.verify_tokens}"

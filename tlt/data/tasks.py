"""Typed records of the math data layer: a problem, and the family/difficulty mix problems are drawn from."""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Task families generated with reasoning-gym that tlt writes step-by-step solutions for (the SFT data of `tlt
# bootstrap`); each maps an integer difficulty onto the dataset's knobs (tlt.data.sources). gsm_symbolic has a
# single level in reasoning-gym, so its difficulty is always 1. Every other reasoning-gym dataset is a family too
# (`gym_family_names`): default settings, one level, question and answer only (RL prompts and evaluation).
GYM_FAMILIES: tuple[str, ...] = ("chain_sum", "basic_arithmetic", "products", "gsm_symbolic")


@functools.cache
def gym_family_names() -> tuple[str, ...]:
    """Every family `data.families` accepts: the datasets reasoning-gym registers (imported on first use)."""
    from reasoning_gym.factory import DATASETS

    return tuple(sorted(set(DATASETS) | set(GYM_FAMILIES)))


def unknown_families(families) -> list[str]:
    """The names in `families` that are no reasoning-gym dataset."""
    return [f for f in families if f not in GYM_FAMILIES and f not in gym_family_names()]


@dataclass(frozen=True)
class MathProblem:
    """One math problem with its gold answer and, where we can write one, a step-by-step target solution."""

    question: str
    answer: str  # gold final answer, e.g. "42" or "\\frac{1}{2}"
    family: str  # "chain_sum", ..., "gsm8k" / "math" for local JSONL files
    difficulty: int  # 1 = easiest
    solution: str | None  # full target text ending in "The answer is \\boxed{answer}." (None: no solution)


@dataclass(frozen=True)
class TaskMix:
    """Families to draw, their weights, and the difficulty law P(d) ~ decay^(d-1) for d in 1..max_difficulty.

    A decay below 1 makes most problems easy and a few very hard: that is what gives the long-tailed response
    lengths the rollout engine has to cope with. decay = 1 draws difficulties uniformly.
    """

    families: tuple[str, ...]
    weights: tuple[float, ...]  # one sampling weight per family, any positive scale
    max_difficulty: int
    difficulty_decay: float

    def __post_init__(self) -> None:
        if not self.families:
            raise ValueError(f"TaskMix.families is empty; name at least one of {', '.join(GYM_FAMILIES)}")
        unknown = unknown_families(self.families)
        if unknown:
            raise ValueError(f"TaskMix.families: unknown {unknown}; reasoning-gym has: {', '.join(gym_family_names())}")
        if len(set(self.families)) != len(self.families):
            raise ValueError(f"TaskMix.families lists a family twice: {self.families}")
        if len(self.weights) != len(self.families):
            raise ValueError(
                f"TaskMix.weights: got {len(self.weights)} values for {len(self.families)} families; "
                "give one weight per family"
            )
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError(f"TaskMix.weights must be >= 0 with a positive sum, got {self.weights}")
        if not 1 <= self.max_difficulty <= 50:
            raise ValueError(f"TaskMix.max_difficulty must be an integer in [1, 50], got {self.max_difficulty}")
        if not 0 < self.difficulty_decay <= 1:
            raise ValueError(f"TaskMix.difficulty_decay must be in (0, 1], got {self.difficulty_decay}")

    def difficulty_weights(self) -> tuple[float, ...]:
        """Unnormalised P(d) for d = 1..max_difficulty."""
        return tuple(self.difficulty_decay ** (d - 1) for d in range(1, self.max_difficulty + 1))


DEFAULT_MIX = TaskMix(
    families=("chain_sum", "basic_arithmetic", "products"),
    weights=(0.6, 0.25, 0.15),
    max_difficulty=16,
    difficulty_decay=0.7,
)

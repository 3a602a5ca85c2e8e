"""A fake decode environment for tuner tests: known step costs and acceptance, seeded, no engine."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from tlt.schedulers.tuners import StrategyTuner
from tlt.speculative.strategy import SpecStrategy


@dataclass
class FakeEnv:
    """Step times linear in the batch b, +-`noise` uniform jitter:

    plain: 10 ms + 0.2 ms * b;  SD (verify_tokens v): 12 ms + 0.25 ms * v * b.
    Each row of an SD step accepts a chain prefix: depth k with probability acceptance^k, capped at `steps`.
    With acceptance 0.7 and arms 4_1_5, 2_1_3: 4_1_5 is best at b <= 4 (by >= 14%), plain at b = 64 (by 20%).
    """

    seed: int
    acceptance: float = 0.7
    noise: float = 0.05
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def step(self, strategy: SpecStrategy | None, batch_size: int) -> tuple[int, float]:
        """(generated tokens, seconds) of one decode step."""
        jitter = 1 + self.noise * (2 * self.rng.random() - 1)
        if strategy is None:
            return batch_size, (0.010 + 0.0002 * batch_size) * jitter
        accepted = sum(self._chain(strategy.steps) for _ in range(batch_size))
        return batch_size + accepted, (0.012 + 0.00025 * strategy.verify_tokens * batch_size) * jitter

    def _chain(self, steps: int) -> int:
        depth = 0
        while depth < steps and self.rng.random() < self.acceptance:
            depth += 1
        return depth


def drive(tuner: StrategyTuner, env: FakeEnv, batch_sizes: list[int]) -> list[SpecStrategy | None]:
    """Run select -> env step -> update over the batch sizes; the selected arms in order."""
    picks = []
    for b in batch_sizes:
        arm = tuner.select(b)
        tuner.update(arm, b, *env.step(arm, b))
        picks.append(arm)
    return picks


def share(picks: list[SpecStrategy | None], batch_sizes: list[int], batch_size: int) -> Counter:
    """Fraction of the steps at `batch_size` that played each arm (keys: str(arm), 'None' for plain)."""
    chosen = Counter(str(a) for a, b in zip(picks, batch_sizes, strict=True) if b == batch_size)
    total = sum(chosen.values())
    return Counter({k: v / total for k, v in chosen.items()})


class Sim:
    """What the `sim` fixture hands to tests."""

    Env = FakeEnv
    drive = staticmethod(drive)
    share = staticmethod(share)


@pytest.fixture
def sim() -> type[Sim]:
    return Sim

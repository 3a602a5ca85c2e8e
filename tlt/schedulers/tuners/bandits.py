"""Bucketed bandits over SD strategies: BEG (TLT's bucketed epsilon-greedy) and UCB1.

Batch sizes are grouped into buckets by upper bound (default (1, 4, 20, inf): [1], [2-4], [5-20], [21+], as in
TLT's reference). Each bucket runs its own bandit whose arms are the configured strategies plus plain decoding
(None), so whether SD pays at all is learned per bucket, not assumed.

Reward normalisation: the reward of a step is tokens/s *per sequence*, generated_tokens / (seconds *
batch_size). A bucket spans several batch sizes ([5-20] is a 4x range); raw tokens/s grows about linearly with
the batch while decoding is memory-bound, so an arm that happened to be played at larger batches would look
better for no fault of its own. Per-sequence throughput is nearly flat in that regime, which makes rewards
comparable inside a bucket with one statistic per arm (per-batch-size statistics would need ~16x more samples
in [5-20] to converge).

Deviations from the reference: a bucket with a single arm is a configuration error (the reference's
one-strategy buckets never explored); arms are keyed by position, not by verify count (the reference crashed
when two strategies shared one).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from typing import Any

from tlt.schedulers.tuners.base import (
    Arm,
    RewardWindow,
    StrategyTuner,
    arm_name,
    check_batch_size,
    check_int,
    check_number,
    check_step,
    rng_state,
    set_rng_state,
)
from tlt.speculative.strategy import SpecStrategy

DEFAULT_BUCKETS: tuple[float, ...] = (1, 4, 20, math.inf)


def parse_buckets(buckets: Sequence[float | int | str | None]) -> tuple[float, ...]:
    """Validate bucket upper bounds: increasing integers >= 1, the last one unbounded (inf or None)."""
    bounds = tuple(math.inf if b is None or str(b).lower() in ("inf", "infinity") else b for b in buckets)
    if not bounds or bounds[-1] != math.inf:
        raise ValueError(
            f"buckets must be increasing batch-size upper bounds ending with inf (so every batch size has a "
            f"bucket), e.g. [1, 4, 20, inf]; got {list(buckets)!r}"
        )
    for b in bounds[:-1]:
        check_int("each finite bucket bound in buckets", b, minimum=1)
    if any(hi <= lo for lo, hi in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"buckets must be strictly increasing, got {list(buckets)!r}")
    return bounds


def bucket_label(bounds: Sequence[float], index: int) -> str:
    lo = 1 if index == 0 else int(bounds[index - 1]) + 1
    hi = bounds[index]
    return f"[{lo}+]" if hi == math.inf else f"[{lo}-{int(hi)}]" if hi > lo else f"[{lo}]"


class _ArmStats:
    """Windowed reward mean and lifetime pull count of one arm in one bucket."""

    def __init__(self, window: int) -> None:
        self.rewards = RewardWindow(window)
        self.pulls = 0

    def to_state(self) -> dict[str, Any]:
        return {"rewards": self.rewards.to_state(), "pulls": self.pulls}

    def load(self, state: dict[str, Any]) -> None:
        self.rewards.load(state["rewards"])
        self.pulls = int(state["pulls"])


class BucketedBandit(StrategyTuner):
    """Shared machinery: buckets, per-bucket arms, windowed per-sequence rewards, unplayed arms first."""

    def __init__(
        self,
        strategies: Sequence[SpecStrategy | str],
        seed: int = 0,
        buckets: Sequence[float | int | str | None] = DEFAULT_BUCKETS,
        window: int = 300,
        bucket_strategies: Sequence[Sequence[SpecStrategy | str]] | None = None,
    ) -> None:
        check_int("window", window, minimum=1)
        self.bounds = parse_buckets(buckets)
        self.window = window
        self.arms = _bucket_arms(self.bounds, strategies, bucket_strategies)  # per bucket: strategies + [None]
        self.stats = [[_ArmStats(window) for _ in arms] for arms in self.arms]
        self.rng = random.Random(seed)

    def bucket_index(self, batch_size: int) -> int:
        return bisect.bisect_left(self.bounds, batch_size)

    def select(self, batch_size: int) -> SpecStrategy | None:
        check_batch_size(batch_size)
        index = self.bucket_index(batch_size)
        stats = self.stats[index]
        for arm, arm_stats in zip(self.arms[index], stats, strict=True):
            if arm_stats.pulls == 0:
                return arm
        return self.arms[index][self._choose(stats)]

    def update(self, strategy: SpecStrategy | None, batch_size: int, generated_tokens: int, seconds: float) -> None:
        check_batch_size(batch_size)
        index = self.bucket_index(batch_size)
        check_step(strategy, self.arms[index], batch_size, generated_tokens, seconds)
        arm_stats = self.stats[index][self.arms[index].index(strategy)]
        arm_stats.rewards.push(generated_tokens / (seconds * batch_size))
        arm_stats.pulls += 1

    def _choose(self, stats: list[_ArmStats]) -> int:
        """Index of the arm to play once every arm of the bucket has been played."""
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        return {
            "buckets": [None if b == math.inf else int(b) for b in self.bounds],
            "window": self.window,
            "arms": [[arm_name(a) for a in arms] for arms in self.arms],
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "rng": rng_state(self.rng),
            "stats": [[s.to_state() for s in stats] for stats in self.stats],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        set_rng_state(self.rng, state["rng"])
        for stats, saved in zip(self.stats, state["stats"], strict=True):
            for arm_stats, arm_saved in zip(stats, saved, strict=True):
                arm_stats.load(arm_saved)


def _bucket_arms(
    bounds: Sequence[float],
    strategies: Sequence[SpecStrategy | str],
    bucket_strategies: Sequence[Sequence[SpecStrategy | str]] | None,
) -> list[list[Arm]]:
    """Per bucket: its strategies (all unless `bucket_strategies` narrows them) plus plain decoding."""
    everything = [SpecStrategy.parse(s) for s in strategies]
    if len(set(everything)) != len(everything):
        raise ValueError(f"strategies contain duplicates: {[str(s) for s in everything]}")
    if bucket_strategies is None:
        per_bucket = [everything] * len(bounds)
    elif len(bucket_strategies) != len(bounds):
        raise ValueError(
            f"bucket_strategies has {len(bucket_strategies)} entries but there are {len(bounds)} buckets "
            f"{[bucket_label(bounds, i) for i in range(len(bounds))]}: give one strategy list per bucket"
        )
    else:
        per_bucket = [[SpecStrategy.parse(s) for s in group] for group in bucket_strategies]
    for index, group in enumerate(per_bucket):
        stray = [str(s) for s in group if s not in everything]
        if stray:
            raise ValueError(f"bucket_strategies[{index}] has {stray}, which are not in strategies")
        if not group:
            raise ValueError(
                f"bucket {bucket_label(bounds, index)} would have a single arm (plain decoding): a bandit "
                "needs at least 2 arms to learn anything, so give it at least one SD strategy (TLT's "
                "reference BEG had one-strategy buckets and never explored)"
            )
    return [[*group, None] for group in per_bucket]


class BEGTuner(BucketedBandit):
    """Bucketed epsilon-greedy (TLT, arXiv 2511.16665 §adaptive rollout engine).

    Per bucket: every arm is played once first; then with probability `epsilon` a uniformly random arm other
    than the greedy one (so exploration always changes the arm), else the arm with the best mean reward over
    its last `window` steps (ties: the first configured). Rewards are tokens/s per sequence (see the module
    docstring).
    """

    kind = "beg"

    def __init__(
        self,
        strategies: Sequence[SpecStrategy | str],
        seed: int = 0,
        buckets: Sequence[float | int | str | None] = DEFAULT_BUCKETS,
        window: int = 300,
        epsilon: float = 0.1,
        bucket_strategies: Sequence[Sequence[SpecStrategy | str]] | None = None,
    ) -> None:
        check_number("epsilon", epsilon, maximum=1, meaning="exploration probability")
        super().__init__(strategies, seed, buckets, window, bucket_strategies)
        self.epsilon = float(epsilon)

    def _choose(self, stats: list[_ArmStats]) -> int:
        means = [s.rewards.mean for s in stats]
        greedy = means.index(max(means))
        if self.rng.random() < self.epsilon:
            return self.rng.choice([i for i in range(len(stats)) if i != greedy])
        return greedy

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "epsilon": self.epsilon}


class UCB1Tuner(BucketedBandit):
    """Bucketed UCB1 (Auer et al. 2002) on normalised rewards.

    Score of arm a in a bucket: mean_a / max_b mean_b + exploration * sqrt(2 ln N / n_a), with windowed means
    (tokens/s per sequence), n_a the arm's lifetime pulls in the bucket and N their sum. Dividing by the best
    mean puts rewards in [0, 1] whatever the machine's speed, as UCB1's bonus assumes; competing arms then
    mostly lie within [0.5, 1], half UCB1's range, hence the default bonus scale `exploration` = 0.5 rather
    than 1.
    """

    kind = "ucb1"

    def __init__(
        self,
        strategies: Sequence[SpecStrategy | str],
        seed: int = 0,
        buckets: Sequence[float | int | str | None] = DEFAULT_BUCKETS,
        window: int = 300,
        exploration: float = 0.5,
        bucket_strategies: Sequence[Sequence[SpecStrategy | str]] | None = None,
    ) -> None:
        check_number("exploration", exploration, maximum=10, meaning="UCB1 bonus scale")
        super().__init__(strategies, seed, buckets, window, bucket_strategies)
        self.exploration = float(exploration)

    def _choose(self, stats: list[_ArmStats]) -> int:
        means = [s.rewards.mean for s in stats]
        scale = max(means) if max(means) > 0 else 1.0
        log_total = math.log(sum(s.pulls for s in stats))
        scores = [
            m / scale + self.exploration * math.sqrt(2 * log_total / s.pulls) for m, s in zip(means, stats, strict=True)
        ]
        return scores.index(max(scores))

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "exploration": self.exploration}

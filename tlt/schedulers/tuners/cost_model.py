"""A model-based SD tuner: predict tokens/s of every arm at the current batch size and play the best.

No hand-set buckets. Per arm (each strategy, and plain decoding) it fits the step time as a line in the batch
size, seconds(b) = a + c * b, by least squares over the arm's last `window` steps; per strategy it also keeps
the mean accepted draft tokens per row over the last `acceptance_window` SD steps (accepted = generated - b
per step, since update() only reports generated tokens; pooled over rows, so a batch-64 step weighs 64 rows).
It then predicts

    SD:    b * (1 + accepted) / t_sd(b)        plain:    b / t_plain(b)

and plays the arm with the highest prediction, so SD turns off where plain decoding is predicted faster.
Exploration keeps the estimates fresh: every arm is forced `min_pulls` times per power-of-two batch range
([1], [2-3], [4-7], ...), and an epsilon that decays as epsilon * decay / (decay + steps) down to
`epsilon_min` plays a random other arm among those predicted at least `explore_ratio` times as fast as the
best here (exploring an arm known to be 3x slower at this batch size only burns time). Acceptance samples
older than `acceptance_horizon` tuner steps are dropped and an arm left with fewer than `min_pulls` fresh ones
is forced again, so acceptance drift of the arms not being played is noticed too.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

from tlt.schedulers.tuners.base import (
    Arm,
    StrategyTuner,
    arm_name,
    check_batch_size,
    check_int,
    check_state,
    check_step,
    rng_state,
    set_rng_state,
)
from tlt.speculative.strategy import SpecStrategy


class LinearCost:
    """Windowed least-squares fit of seconds(b) = a + c * b with O(1) updates (running sums)."""

    def __init__(self, maxlen: int) -> None:
        self.points: deque[tuple[int, float]] = deque(maxlen=maxlen)
        self.sums = [0.0, 0.0, 0.0, 0.0]  # sum b, sum t, sum b^2, sum b*t
        self.pushes = 0

    def push(self, batch_size: int, seconds: float) -> None:
        if len(self.points) == self.points.maxlen:
            self._add(*self.points[0], sign=-1.0)
        self.points.append((batch_size, seconds))
        self._add(batch_size, seconds, sign=1.0)
        self.pushes += 1
        if self.pushes % self.points.maxlen == 0:  # bound float drift of the running sums
            self.sums = [math.fsum(term(b, t) for b, t in self.points) for term in _TERMS]

    def _add(self, b: int, t: float, sign: float) -> None:
        for i, term in enumerate(_TERMS):
            self.sums[i] += sign * term(b, t)

    def predict(self, batch_size: int) -> float | None:
        """Predicted seconds at this batch size; None without data. Slope and intercept are kept >= 0."""
        n = len(self.points)
        if n == 0:
            return None
        sum_b, sum_t, sum_bb, sum_bt = self.sums
        mean_b, mean_t = sum_b / n, sum_t / n
        var_b = sum_bb / n - mean_b * mean_b
        slope = max((sum_bt / n - mean_b * mean_t) / var_b, 0.0) if var_b > 1e-6 * max(mean_b, 1.0) else 0.0
        intercept = mean_t - slope * mean_b
        if intercept < 0:  # refit through the origin
            intercept, slope = 0.0, sum_bt / sum_bb
        return max(intercept + slope * batch_size, 1e-12)

    def to_state(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self.points], "sums": list(self.sums), "pushes": self.pushes}

    def load(self, state: dict[str, Any]) -> None:
        self.points = deque(((int(b), float(t)) for b, t in state["points"]), maxlen=self.points.maxlen)
        self.sums = [float(s) for s in state["sums"]]
        self.pushes = int(state["pushes"])


_TERMS = (lambda b, t: float(b), lambda b, t: t, lambda b, t: float(b * b), lambda b, t: b * t)


class RecentAcceptance:
    """Accepted draft tokens and rows of an arm's last `maxlen` SD steps no older than `horizon` tuner steps.

    Integer running totals, so the pooled mean per row is exact. Dropping old steps makes an arm that has not
    been played for a while count as unmeasured, so the tuner re-measures it (acceptance drifts as the policy
    trains).
    """

    def __init__(self, maxlen: int, horizon: int) -> None:
        self.steps: deque[tuple[int, int, int]] = deque(maxlen=maxlen)  # (tuner step, accepted, rows)
        self.horizon = horizon
        self.accepted = 0
        self.rows = 0

    def push(self, now: int, accepted: int, rows: int) -> None:
        if len(self.steps) == self.steps.maxlen:
            self._drop()
        self.steps.append((now, accepted, rows))
        self.accepted += accepted
        self.rows += rows

    def expire(self, now: int) -> None:
        while self.steps and self.steps[0][0] <= now - self.horizon:
            self._drop()

    def _drop(self) -> None:
        _, accepted, rows = self.steps.popleft()
        self.accepted -= accepted
        self.rows -= rows

    @property
    def mean(self) -> float:
        return self.accepted / self.rows if self.rows else 0.0

    def to_state(self) -> list[list[int]]:
        return [list(step) for step in self.steps]

    def load(self, state: list[list[int]]) -> None:
        self.steps = deque((tuple(int(v) for v in step) for step in state), maxlen=self.steps.maxlen)
        self.accepted = sum(step[1] for step in self.steps)
        self.rows = sum(step[2] for step in self.steps)


class CostModelTuner(StrategyTuner):
    """Plays the arm with the best predicted tokens/s from online cost and acceptance models."""

    kind = "cost"

    def __init__(
        self,
        strategies: Sequence[SpecStrategy | str],
        seed: int = 0,
        window: int = 128,
        acceptance_window: int = 128,
        acceptance_horizon: int = 1000,
        min_pulls: int = 2,
        epsilon: float = 0.1,
        epsilon_min: float = 0.02,
        epsilon_decay: int = 1000,
        explore_ratio: float = 0.7,
    ) -> None:
        self.arms: list[Arm] = [*(SpecStrategy.parse(s) for s in strategies), None]
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"strategies contain duplicates: {[arm_name(a) for a in self.arms[:-1]]}")
        if len(self.arms) < 2:
            raise ValueError("CostModelTuner needs at least one SD strategy to weigh against plain decoding")
        check_int("window", window, minimum=2)
        check_int("acceptance_window", acceptance_window, minimum=1)
        check_int("acceptance_horizon", acceptance_horizon, minimum=1)
        check_int("min_pulls", min_pulls, minimum=1)
        check_int("epsilon_decay", epsilon_decay, minimum=1)
        for name, value in (("epsilon", epsilon), ("epsilon_min", epsilon_min)):
            if not (isinstance(value, int | float) and 0 <= value <= 1):
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if not (isinstance(explore_ratio, int | float) and 0 <= explore_ratio <= 1):
            raise ValueError(f"explore_ratio must be a number in [0, 1], got {explore_ratio!r}")
        if epsilon_min > epsilon:
            raise ValueError(f"epsilon_min must be <= epsilon, got epsilon_min={epsilon_min}, epsilon={epsilon}")
        self.options = {
            "window": window,
            "acceptance_window": acceptance_window,
            "acceptance_horizon": acceptance_horizon,
            "min_pulls": min_pulls,
            "epsilon": float(epsilon),
            "epsilon_min": float(epsilon_min),
            "epsilon_decay": epsilon_decay,
            "explore_ratio": float(explore_ratio),
        }
        self.costs = [LinearCost(window) for _ in self.arms]
        self.acceptance = [RecentAcceptance(acceptance_window, acceptance_horizon) for _ in self.arms]
        self.pulls_per_octave: list[list[int]] = [[] for _ in self.arms]  # [arm][floor(log2 b)] lifetime pulls
        self.steps = 0
        self.rng = random.Random(seed)

    @property
    def epsilon(self) -> float:
        """Current exploration probability."""
        opts = self.options
        return max(
            opts["epsilon_min"],
            opts["epsilon"] * opts["epsilon_decay"] / (opts["epsilon_decay"] + self.steps),
        )

    def predicted_tokens_per_second(self, strategy: SpecStrategy | None, batch_size: int) -> float | None:
        """Model prediction for one arm at this batch size; None while the arm has no data."""
        return self._predict(self.arms.index(strategy), batch_size)

    def _predict(self, index: int, batch_size: int) -> float | None:
        seconds = self.costs[index].predict(batch_size)
        if seconds is None:
            return None
        accepted = self.acceptance[index].mean if self.arms[index] is not None else 0.0
        return batch_size * (1.0 + accepted) / seconds

    def select(self, batch_size: int) -> SpecStrategy | None:
        check_batch_size(batch_size)
        forced = self._forced_arm(batch_size)
        if forced is not None:
            return self.arms[forced]
        rates = [self._predict(index, batch_size) or 0.0 for index in range(len(self.arms))]
        best = rates.index(max(rates))
        if self.rng.random() < self.epsilon:
            # explore only arms predicted competitive here: a tree at batch 128 can cost 3 plain steps
            floor = self.options["explore_ratio"] * rates[best]
            others = [a for i, a in enumerate(self.arms) if i != best and rates[i] >= floor]
            if others:
                return self.rng.choice(others)
        return self.arms[best]

    def _forced_arm(self, batch_size: int) -> int | None:
        """An arm with fewer than `min_pulls` pulls in this batch size's octave, or (SD arms) fresh steps."""
        octave = batch_size.bit_length() - 1
        min_pulls = self.options["min_pulls"]
        for index, (pulls, acceptance) in enumerate(zip(self.pulls_per_octave, self.acceptance, strict=True)):
            acceptance.expire(self.steps)
            if (pulls[octave] if octave < len(pulls) else 0) < min_pulls:
                return index
            if self.arms[index] is not None and len(acceptance.steps) < min_pulls:
                return index
        return None

    def update(self, strategy: SpecStrategy | None, batch_size: int, generated_tokens: int, seconds: float) -> None:
        check_step(strategy, self.arms, batch_size, generated_tokens, seconds)
        index = self.arms.index(strategy)
        self.costs[index].push(batch_size, float(seconds))
        if strategy is not None:
            self.acceptance[index].push(self.steps, max(generated_tokens - batch_size, 0), batch_size)
        pulls = self.pulls_per_octave[index]
        octave = batch_size.bit_length() - 1
        pulls.extend([0] * (octave + 1 - len(pulls)))
        pulls[octave] += 1
        self.steps += 1

    def _config(self) -> dict[str, Any]:
        return {"arms": [arm_name(a) for a in self.arms], **self.options}

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "config": self._config(),
            "rng": rng_state(self.rng),
            "steps": self.steps,
            "costs": [c.to_state() for c in self.costs],
            "acceptance": [a.to_state() for a in self.acceptance],
            "pulls_per_octave": [list(p) for p in self.pulls_per_octave],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.kind, self._config())
        set_rng_state(self.rng, state["rng"])
        self.steps = int(state["steps"])
        for cost, saved in zip(self.costs, state["costs"], strict=True):
            cost.load(saved)
        for acceptance, saved in zip(self.acceptance, state["acceptance"], strict=True):
            acceptance.load(saved)
        self.pulls_per_octave = [[int(n) for n in p] for p in state["pulls_per_octave"]]

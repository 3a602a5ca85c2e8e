"""A model-based SD tuner: predict tokens/s of every arm at the current batch size and play the best.

No hand-set buckets. The statistics are local in log2 of the batch size, because neither cost nor acceptance
is the same across a rollout: step time bends away from a line as the batch grows (a CPU turns from
weight-bandwidth-bound to compute-bound), and the sequences left in the long tail accept differently (often
repetitive, so more) than the full batch. Per arm (each strategy, and plain decoding) and per power-of-two
batch range ("octave": [1], [2-3], [4-7], ...) the tuner keeps the arm's last `window` steps there and, per
strategy, the accepted draft tokens per row of its last `acceptance_window` SD steps there (accepted =
generated - b per step, since update() only reports generated tokens). At batch size b it fits the step time
as a line, seconds(b) = a + c * b, by least squares over the points of b's octave and its two neighbours, takes
the mean accepted tokens per row in b's octave (while that holds fewer than `min_pulls` fresh SD steps, over the
same three octaves, and while those do, over all batch sizes), and predicts

    SD:    b * (1 + accepted) / t_sd(b)        plain:    b / t_plain(b)

then plays the arm with the highest prediction, so SD turns off where plain decoding is predicted faster.
Exploration keeps the estimates fresh: every arm is forced `min_pulls` times per octave, and an epsilon that
decays as epsilon * decay / (decay + steps) down to `epsilon_min` plays a random other arm among those
predicted at least `explore_ratio` times as fast as the best here (exploring an arm known to be 3x slower at
this batch size only burns time). Acceptance samples older than `acceptance_horizon` tuner steps are dropped
and an SD arm left with fewer than `min_pulls` fresh ones over all batch sizes is forced again, so acceptance
drift of the arms not being played is noticed too.

Predictions are cached per (arm, batch size) and recomputed only when that arm was updated or one of the
acceptance samples they used has grown stale, so a decode step that plays one arm refits one arm, not all.
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
    check_number,
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
        sums = self.sums  # the _TERMS, written out: this runs on every decode step
        sums[0] += sign * b
        sums[1] += sign * t
        sums[2] += sign * b * b
        sums[3] += sign * b * t

    def predict(self, batch_size: int) -> float | None:
        """Predicted seconds at this batch size; None without data. Slope and intercept are kept >= 0."""
        return fit_line([self], batch_size)

    def to_state(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self.points], "sums": list(self.sums), "pushes": self.pushes}

    def load(self, state: dict[str, Any]) -> None:
        self.points = deque(((int(b), float(t)) for b, t in state["points"]), maxlen=self.points.maxlen)
        self.sums = [float(s) for s in state["sums"]]
        self.pushes = int(state["pushes"])


_TERMS = (lambda b, t: float(b), lambda b, t: t, lambda b, t: float(b * b), lambda b, t: b * t)


def fit_line(costs: Sequence[LinearCost], batch_size: int) -> float | None:
    """Least-squares line through the points of all `costs`, evaluated at `batch_size`; None without points.

    Slope and intercept are kept >= 0 (noise must not predict a step getting cheaper as the batch grows).
    """
    n = sum(len(c.points) for c in costs)
    if n == 0:
        return None
    sum_b, sum_t, sum_bb, sum_bt = (sum(c.sums[i] for c in costs) for i in range(len(_TERMS)))
    mean_b, mean_t = sum_b / n, sum_t / n
    var_b = sum_bb / n - mean_b * mean_b
    slope = max((sum_bt / n - mean_b * mean_t) / var_b, 0.0) if var_b > 1e-6 * max(mean_b, 1.0) else 0.0
    intercept = mean_t - slope * mean_b
    if intercept < 0:  # refit through the origin
        intercept, slope = 0.0, sum_bt / sum_bb
    return max(intercept + slope * batch_size, 1e-12)


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

    @property
    def stale_at(self) -> float:
        """The tuner step at which the oldest sample here expires; infinity when empty."""
        return self.steps[0][0] + self.horizon if self.steps else math.inf

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


_MAX_CACHED = 1 << 14  # cached (arm, batch size) predictions before the cache starts over


def _octave(batch_size: int) -> int:
    """floor(log2 b): the power-of-two batch range [1], [2-3], [4-7], ... that b falls in."""
    return batch_size.bit_length() - 1


def _near_octaves(batch_size: int) -> slice:
    """The octaves next to and including batch_size's: [b/2, 4b) roughly."""
    octave = _octave(batch_size)
    return slice(max(octave - 1, 0), octave + 2)


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
        for name, value in (("epsilon", epsilon), ("epsilon_min", epsilon_min), ("explore_ratio", explore_ratio)):
            check_number(name, value, maximum=1)
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
        # [arm][octave] with octave = floor(log2 b), grown as batch sizes appear
        self.costs: list[list[LinearCost]] = [[] for _ in self.arms]
        self.local_acceptance: list[list[RecentAcceptance]] = [[] for _ in self.arms]
        self.pulls_per_octave: list[list[int]] = [[] for _ in self.arms]  # lifetime pulls
        self.acceptance = [RecentAcceptance(acceptance_window, acceptance_horizon) for _ in self.arms]
        self.steps = 0
        self.rng = random.Random(seed)
        self._clear_predictions()

    def _clear_predictions(self) -> None:
        """Forget cached predictions; `_versions[arm]` counts the updates each one was computed after."""
        self._versions = [0] * len(self.arms)
        self._predictions: dict[tuple[int, int], tuple[int, float, float | None]] = {}

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
        """`_fresh_prediction`, cached until the arm is updated or an acceptance sample it used expires."""
        key = (index, batch_size)
        cached = self._predictions.get(key)
        if cached is not None and cached[0] == self._versions[index] and self.steps < cached[1]:
            return cached[2]
        if len(self._predictions) >= _MAX_CACHED:
            self._predictions.clear()
        rate, stale_at = self._fresh_prediction(index, batch_size)
        self._predictions[key] = (self._versions[index], stale_at, rate)
        return rate

    def _fresh_prediction(self, index: int, batch_size: int) -> tuple[float | None, float]:
        """(predicted tokens/s or None without data, tuner step at which an acceptance sample used expires)."""
        near = _near_octaves(batch_size)
        seconds = fit_line(self.costs[index][near], batch_size)
        if seconds is None:
            return None, math.inf
        if self.arms[index] is None:
            return batch_size / seconds, math.inf
        accepted, stale_at = self._accepted_per_row(index, batch_size, near)
        return batch_size * (1.0 + accepted) / seconds, stale_at

    def _accepted_per_row(self, index: int, batch_size: int, near: slice) -> tuple[float, float]:
        """Mean accepted draft tokens per row at this batch size: its own octave's, else (while that holds fewer
        than `min_pulls` fresh SD steps) the neighbouring octaves' pooled, else all sizes'; and the tuner step at
        which the oldest sample that could change it expires.

        Own octave first, because rows pooled by count let the larger batches dominate, and their rows are not
        those left at 1-3 (the tail's longest responses, which a model-free drafter's history covers least):
        pooling them kept SD on at 1-3 rows where it lost (the tiny policy with the suffix drafter)."""
        octaves = self.local_acceptance[index]
        own, local = octaves[_octave(batch_size) :][:1], octaves[near]
        for acceptance in local:
            acceptance.expire(self.steps)
        stale_at = min(a.stale_at for a in (*local, self.acceptance[index]))
        for pool in (own, local):
            if sum(len(a.steps) for a in pool) >= self.options["min_pulls"]:
                return sum(a.accepted for a in pool) / sum(a.rows for a in pool), stale_at
        return self.acceptance[index].mean, stale_at

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
        octave = _octave(batch_size)
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
        octave = _octave(batch_size)
        self._grow(index, octave)
        self.costs[index][octave].push(batch_size, float(seconds))
        if strategy is not None:
            accepted = max(generated_tokens - batch_size, 0)
            self.acceptance[index].push(self.steps, accepted, batch_size)
            self.local_acceptance[index][octave].push(self.steps, accepted, batch_size)
        self.pulls_per_octave[index][octave] += 1
        self.steps += 1
        self._versions[index] += 1

    def _grow(self, index: int, octave: int) -> None:
        """Per-octave statistics of one arm up to `octave`."""
        opts = self.options
        for _ in range(octave + 1 - len(self.costs[index])):
            self.costs[index].append(LinearCost(opts["window"]))
            self.local_acceptance[index].append(RecentAcceptance(opts["acceptance_window"], opts["acceptance_horizon"]))
            self.pulls_per_octave[index].append(0)

    def _config(self) -> dict[str, Any]:
        return {"arms": [arm_name(a) for a in self.arms], **self.options}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "rng": rng_state(self.rng),
            "steps": self.steps,
            "costs": [[c.to_state() for c in arm] for arm in self.costs],
            "local_acceptance": [[a.to_state() for a in arm] for arm in self.local_acceptance],
            "acceptance": [a.to_state() for a in self.acceptance],
            "pulls_per_octave": [list(p) for p in self.pulls_per_octave],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        set_rng_state(self.rng, state["rng"])
        self.steps = int(state["steps"])
        self._clear_predictions()
        self.pulls_per_octave = [[] for _ in self.arms]
        self.costs, self.local_acceptance = [[] for _ in self.arms], [[] for _ in self.arms]
        for index, pulls in enumerate(state["pulls_per_octave"]):
            self._grow(index, len(pulls) - 1)
            self.pulls_per_octave[index] = [int(n) for n in pulls]
            for cost, saved in zip(self.costs[index], state["costs"][index], strict=True):
                cost.load(saved)
            for acceptance, saved in zip(self.local_acceptance[index], state["local_acceptance"][index], strict=True):
                acceptance.load(saved)
        for acceptance, saved in zip(self.acceptance, state["acceptance"], strict=True):
            acceptance.load(saved)

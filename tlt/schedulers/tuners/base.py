"""The SD strategy tuner contract, the two fixed tuners (off, fixed) and helpers shared by the learning ones.

The rollout engine asks `select(batch_size)` before every decode step and reports the step back with
`update(...)` after it, plain steps included, so learning tuners can compare SD against plain decoding.
Pure Python: no torch, no engine imports.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from tlt.speculative.strategy import SpecStrategy

Arm = SpecStrategy | None  # None = plain decoding (SD off)


class StrategyTuner(ABC):
    """Picks the SD strategy (or plain decoding) for each decode step from the running batch size."""

    kind: ClassVar[str]

    @abstractmethod
    def select(self, batch_size: int) -> SpecStrategy | None:
        """The strategy for the next decode step at this running batch size; None decodes plainly."""

    @abstractmethod
    def update(self, strategy: SpecStrategy | None, batch_size: int, generated_tokens: int, seconds: float) -> None:
        """Feed back one finished step: `generated_tokens` appended across the batch in `seconds`.

        Under SD that is accepted tokens + one bonus per row; under plain decoding (strategy None) it is
        batch_size. Called after every step, plain ones too.
        """

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (plain Python types): kind and `_config()`; learning tuners add statistics and
        RNG state."""
        return {"kind": self.kind, "config": self._config()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`; raises ValueError when it was saved by a differently configured tuner."""
        check_state(state, self.kind, self._config())

    def _config(self) -> dict[str, Any]:
        """The settings a saved state must have been saved with to load here."""
        return {}


class OffTuner(StrategyTuner):
    """Never speculates: the no-SD baseline."""

    kind = "off"

    def select(self, batch_size: int) -> SpecStrategy | None:
        check_batch_size(batch_size)
        return None

    def update(self, strategy: SpecStrategy | None, batch_size: int, generated_tokens: int, seconds: float) -> None:
        check_step(strategy, (None,), batch_size, generated_tokens, seconds)


class FixedTuner(StrategyTuner):
    """One strategy while the running batch is at most `threshold` (TLT's reference uses 32), else plain."""

    kind = "fixed"

    def __init__(self, strategy: SpecStrategy | str, threshold: int = 32) -> None:
        self.strategy = SpecStrategy.parse(strategy)
        check_int("threshold", threshold, minimum=1)
        self.threshold = threshold

    def select(self, batch_size: int) -> SpecStrategy | None:
        check_batch_size(batch_size)
        return self.strategy if batch_size <= self.threshold else None

    def update(self, strategy: SpecStrategy | None, batch_size: int, generated_tokens: int, seconds: float) -> None:
        check_step(strategy, (self.strategy, None), batch_size, generated_tokens, seconds)

    def _config(self) -> dict[str, Any]:
        return {"strategy": str(self.strategy), "threshold": self.threshold}


class RewardWindow:
    """The last `maxlen` values of a stream with an O(1) mean (running sum, re-summed every maxlen pushes)."""

    def __init__(self, maxlen: int) -> None:
        self.values: deque[float] = deque(maxlen=maxlen)
        self.total = 0.0
        self.pushes = 0

    def push(self, value: float) -> None:
        if len(self.values) == self.values.maxlen:
            self.total -= self.values[0]
        self.values.append(value)
        self.total += value
        self.pushes += 1
        if self.pushes % self.values.maxlen == 0:  # bound float drift of the running sum
            self.total = math.fsum(self.values)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return self.total / len(self.values) if self.values else 0.0

    def to_state(self) -> dict[str, Any]:
        return {"values": list(self.values), "total": self.total, "pushes": self.pushes}

    def load(self, state: dict[str, Any]) -> None:
        self.values = deque((float(v) for v in state["values"]), maxlen=self.values.maxlen)
        self.total = float(state["total"])
        self.pushes = int(state["pushes"])


def arm_name(arm: Arm) -> str:
    return "off" if arm is None else str(arm)


def rng_state(rng: random.Random) -> list[Any]:
    """`random.Random.getstate()` as JSON-friendly lists."""
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def set_rng_state(rng: random.Random, state: Sequence[Any]) -> None:
    version, internal, gauss_next = state
    rng.setstate((version, tuple(internal), gauss_next))


def check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_number(name: str, value: Any, maximum: int, meaning: str = "") -> None:
    """Raise unless `value` is a number in [0, maximum]; `meaning` goes in parentheses in the message."""
    if not (isinstance(value, int | float) and 0 <= value <= maximum):
        hint = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name} must be a number in [0, {maximum}]{hint}, got {value!r}")


def check_batch_size(batch_size: int) -> None:
    check_int("batch_size", batch_size, minimum=1)


def check_step(strategy: Arm, arms: Sequence[Arm], batch_size: int, generated_tokens: int, seconds: float) -> None:
    """Validate one update() call against the arms this tuner can have returned."""
    check_batch_size(batch_size)
    check_int("generated_tokens", generated_tokens, minimum=0)
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0 (the step's wall time), got {seconds!r}")
    if strategy not in arms:
        raise ValueError(
            f"update() got strategy {arm_name(strategy)!r}, which this tuner never selects; "
            f"its arms are {[arm_name(a) for a in arms]}"
        )


def check_state(state: dict[str, Any], kind: str, config: dict[str, Any]) -> None:
    """Raise a ValueError naming what differs when `state` comes from another tuner kind or config."""
    if not isinstance(state, dict) or "kind" not in state or "config" not in state:
        raise ValueError(f"not a tuner state_dict (expected a dict with 'kind' and 'config'), got {state!r:.200}")
    if state["kind"] != kind:
        raise ValueError(f"tuner state was saved by a {state['kind']!r} tuner, cannot load it into a {kind!r} tuner")
    saved = state["config"]
    diffs = [f"{k}: saved {saved.get(k)!r}, here {v!r}" for k, v in config.items() if saved.get(k) != v]
    diffs += [f"{k}: saved {saved[k]!r}, unknown here" for k in saved if k not in config]
    if diffs:
        raise ValueError(f"{kind!r} tuner state does not match this tuner's configuration: " + "; ".join(diffs))

"""Build a tuner by kind name: the table the config and the engine use."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from tlt.schedulers.tuners.bandits import BEGTuner, UCB1Tuner
from tlt.schedulers.tuners.base import FixedTuner, OffTuner, StrategyTuner
from tlt.schedulers.tuners.cost_model import CostModelTuner
from tlt.speculative.strategy import SpecStrategy


def parse_strategy_set(spec: str | Sequence[str | SpecStrategy]) -> tuple[SpecStrategy, ...]:
    """`"4_1_5,2_1_3"` or `["4_1_5", SpecStrategy(2, 1, 3)]` -> strategies in order; "" gives none."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and not spec.strip():
        items = []
    if any(isinstance(s, str) and not s for s in items):
        raise ValueError(f"empty entry in strategy set {spec!r}: write e.g. '4_1_5,2_1_3' without stray commas")
    strategies = tuple(SpecStrategy.parse(s) for s in items)
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"strategy set {spec!r} lists a strategy twice: {[str(s) for s in strategies]}")
    return strategies


def _off(strategies: tuple[SpecStrategy, ...], seed: int, **options: Any) -> StrategyTuner:
    return OffTuner(**options)


def _fixed(strategies: tuple[SpecStrategy, ...], seed: int, **options: Any) -> StrategyTuner:
    if len(strategies) != 1:
        raise ValueError(
            f"tuner 'fixed' plays exactly one strategy, got {len(strategies)}: {[str(s) for s in strategies]}"
            "; pass one (e.g. ['4_1_5']) or use a learning tuner ('beg', 'ucb1', 'cost') to choose"
        )
    return FixedTuner(strategies[0], **options)


def _learner(cls: type[StrategyTuner]) -> Callable[..., StrategyTuner]:
    def build(strategies: tuple[SpecStrategy, ...], seed: int, **options: Any) -> StrategyTuner:
        return cls(strategies, seed=seed, **options)

    return build


TUNERS: dict[str, tuple[type[StrategyTuner], Callable[..., StrategyTuner]]] = {
    "off": (OffTuner, _off),
    "fixed": (FixedTuner, _fixed),
    "beg": (BEGTuner, _learner(BEGTuner)),
    "ucb1": (UCB1Tuner, _learner(UCB1Tuner)),
    "cost": (CostModelTuner, _learner(CostModelTuner)),
}


def tuner_options(kind: str) -> tuple[str, ...]:
    """The keyword options `build_tuner` accepts for this kind."""
    cls, _ = _lookup(kind)
    params = inspect.signature(cls.__init__).parameters
    skip = ("self", "strategy", "strategies", "seed")
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(name for name, p in params.items() if name not in skip and p.kind in named)


def build_tuner(
    kind: str, strategies: str | Sequence[str | SpecStrategy], seed: int = 0, **options: Any
) -> StrategyTuner:
    """Build the tuner `kind` ("off", "fixed", "beg", "ucb1", "cost") over `strategies`, seeded."""
    _, build = _lookup(kind)
    unknown = sorted(set(options) - set(tuner_options(kind)))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for tuner {kind!r}; it accepts {list(tuner_options(kind))}")
    return build(parse_strategy_set(strategies), seed, **options)


def _lookup(kind: str) -> tuple[type[StrategyTuner], Callable[..., StrategyTuner]]:
    if kind not in TUNERS:
        raise ValueError(f"unknown tuner kind {kind!r}; choose one of {list(TUNERS)}")
    return TUNERS[kind]


def tuner_from_config(cfg) -> StrategyTuner:
    """The tuner a `tlt.config.SpeculativeConfig` describes (`enabled: false` gives `off`)."""
    kind = cfg.tuner if cfg.enabled else "off"
    options: dict[str, Any] = {
        "off": {},
        "fixed": {"threshold": cfg.threshold},
        "beg": {"buckets": cfg.bucket_bounds, "window": cfg.window, "epsilon": cfg.epsilon},
        "ucb1": {"buckets": cfg.bucket_bounds, "window": cfg.window},
        "cost": {"epsilon": cfg.epsilon},
    }[kind]
    return build_tuner(kind, cfg.strategies, seed=cfg.seed, **options)

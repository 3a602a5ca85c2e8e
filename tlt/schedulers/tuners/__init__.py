"""SD strategy tuners: pick speculative decoding (and which strategy) or plain decoding per decode step.

Kinds: `off`, `fixed`, `beg` (TLT's bucketed epsilon-greedy), `ucb1`, `cost` (online cost model).
Build one with `build_tuner(kind, strategies, seed, **options)`.
"""

from tlt.schedulers.tuners.bandits import DEFAULT_BUCKETS, BEGTuner, UCB1Tuner
from tlt.schedulers.tuners.base import FixedTuner, OffTuner, StrategyTuner
from tlt.schedulers.tuners.cost_model import CostModelTuner
from tlt.schedulers.tuners.registry import (
    TUNERS,
    build_tuner,
    parse_strategy_set,
    tuner_from_config,
    tuner_options,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "TUNERS",
    "BEGTuner",
    "CostModelTuner",
    "FixedTuner",
    "OffTuner",
    "StrategyTuner",
    "UCB1Tuner",
    "build_tuner",
    "tuner_from_config",
    "parse_strategy_set",
    "tuner_options",
]

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlt.schedulers.tuners import (
    TUNERS,
    BEGTuner,
    CostModelTuner,
    FixedTuner,
    OffTuner,
    UCB1Tuner,
    build_tuner,
    parse_strategy_set,
    tuner_options,
)
from tlt.speculative.strategy import SpecStrategy

S415, S213 = SpecStrategy(4, 1, 5), SpecStrategy(2, 1, 3)


def test_parse_strategy_set_forms():
    assert parse_strategy_set("4_1_5,2_1_3") == (S415, S213)
    assert parse_strategy_set(" 4_1_5 , 2_1_3 ") == (S415, S213)
    assert parse_strategy_set(["4_1_5", S213]) == (S415, S213)
    assert parse_strategy_set("") == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("4_1_5,,2_1_3", "empty entry in strategy set"),
        ("4_1_5,", "empty entry in strategy set"),
        ("4_1_5,4_1_5", "lists a strategy twice"),
        ("4_1", "expected 'steps_topk_verifytokens'"),
        ("1_1_5", "exceeds the 2 nodes"),
    ],
)
def test_parse_strategy_set_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_strategy_set(spec)


def test_build_each_kind():
    assert isinstance(build_tuner("off", [], seed=0), OffTuner)
    fixed = build_tuner("fixed", "4_1_5", seed=0, threshold=8)
    assert isinstance(fixed, FixedTuner) and fixed.threshold == 8
    beg = build_tuner("beg", "4_1_5,2_1_3", seed=1, epsilon=0.2, window=50)
    assert isinstance(beg, BEGTuner) and beg.epsilon == 0.2 and beg.window == 50
    assert isinstance(build_tuner("ucb1", ["4_1_5"], seed=0, exploration=1.0), UCB1Tuner)
    assert isinstance(build_tuner("cost", ["4_1_5"], seed=0, window=64), CostModelTuner)
    assert set(TUNERS) == {"off", "fixed", "beg", "ucb1", "cost"}


def test_build_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown tuner kind 'bandit'; choose one of \['off', 'fixed'"):
        build_tuner("bandit", "4_1_5")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['epsilon'\] for tuner 'fixed'; it accepts"):
        build_tuner("fixed", "4_1_5", epsilon=0.1)
    with pytest.raises(ValueError, match="tuner 'fixed' plays exactly one strategy, got 2"):
        build_tuner("fixed", "4_1_5,2_1_3")
    with pytest.raises(ValueError, match="threshold must be an integer >= 1, got 0"):
        build_tuner("fixed", "4_1_5", threshold=0)
    with pytest.raises(ValueError, match=r"epsilon must be a number in \[0, 1\] \(exploration probability\), got 2"):
        build_tuner("beg", "4_1_5", epsilon=2)


def test_tuner_options_lists_keywords():
    assert tuner_options("fixed") == ("threshold",)
    assert tuner_options("off") == ()
    assert "bucket_strategies" in tuner_options("beg")


SETUPS = [
    ("off", "", {}),
    ("fixed", "4_1_5", {"threshold": 16}),
    ("beg", "4_1_5,2_1_3,3_2_6", {"epsilon": 0.3}),
    ("ucb1", "4_1_5,2_2_5", {}),
    ("cost", "4_1_5,2_1_3", {"epsilon": 0.3}),
]


@pytest.mark.parametrize(("kind", "strategies", "options"), SETUPS)
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(1, 100_000), st.integers(0, 64), st.floats(1e-6, 10.0)), max_size=30))
def test_select_only_returns_configured_arms(kind, strategies, options, steps):
    tuner = build_tuner(kind, strategies, seed=0, **options)
    allowed = {None, *parse_strategy_set(strategies)}
    for batch_size, extra, seconds in steps:
        arm = tuner.select(batch_size)
        assert arm in allowed
        tuner.update(arm, batch_size, batch_size + (extra if arm is not None else 0), seconds)
    json.dumps(tuner.state_dict())


@pytest.mark.parametrize("kind", ["off", "fixed", "beg", "ucb1", "cost"])
def test_tuner_from_config_builds_each_kind(kind):
    from tlt.config import load_config
    from tlt.schedulers.tuners import tuner_from_config

    strategies = "['4_1_5']" if kind == "fixed" else "['2_1_3','4_1_5']"
    cfg = load_config(None, [f"speculative.tuner={kind}", f"speculative.strategies={strategies}"]).speculative
    assert tuner_from_config(cfg).kind == kind
    cfg.enabled = False
    assert tuner_from_config(cfg).kind == "off"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["speculative.strategies=['4_1']"], "invalid SD strategy '4_1'"),
        (["speculative.strategies=[8448]"], "quote it"),
        (["speculative.strategies=['1_1_3']"], "exceeds"),
        (["speculative.tuner=fixed"], "exactly one strategy"),
        (["speculative.buckets=['4','1','inf']"], "speculative.buckets"),
        (["speculative.buckets=['1','4']"], "ending with inf"),
        (["speculative.threshold=0"], "speculative.threshold"),
    ],
)
def test_bad_strategy_sets_and_thresholds_in_config_name_the_key(overrides, message):
    from tlt.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)

import json

import pytest

from tlt.schedulers.tuners import FixedTuner, OffTuner
from tlt.schedulers.tuners.base import RewardWindow
from tlt.speculative.strategy import SpecStrategy

S415 = SpecStrategy(4, 1, 5)


def test_off_never_speculates():
    tuner = OffTuner()
    assert [tuner.select(b) for b in (1, 2, 31, 32, 33, 10_000)] == [None] * 6
    tuner.update(None, 4, 4, 0.01)
    assert tuner.state_dict() == {"kind": "off", "config": {}}


def test_fixed_switches_at_threshold():
    tuner = FixedTuner("4_1_5", threshold=8)
    assert [tuner.select(b) for b in (1, 7, 8, 9, 64)] == [S415, S415, S415, None, None]
    tuner.update(S415, 8, 20, 0.02)
    tuner.update(None, 9, 9, 0.02)


def test_fixed_default_threshold_is_the_reference_32():
    tuner = FixedTuner(S415)
    assert tuner.select(32) == S415 and tuner.select(33) is None


@pytest.mark.parametrize("threshold", [0, -1, 2.5, True, "8"])
def test_fixed_rejects_bad_threshold(threshold):
    with pytest.raises(ValueError, match=r"threshold must be an integer >= 1"):
        FixedTuner(S415, threshold=threshold)


def test_fixed_rejects_bad_strategy_string():
    with pytest.raises(ValueError, match="steps_topk_verifytokens"):
        FixedTuner("4-1-5")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((S415, 0, 4, 0.1), "batch_size must be an integer >= 1"),
        ((S415, 4, -1, 0.1), "generated_tokens must be an integer >= 0"),
        ((S415, 4, 4, 0.0), "seconds must be a finite number > 0"),
        ((S415, 4, 4, float("nan")), "seconds must be a finite number > 0"),
        ((SpecStrategy(2, 1, 3), 4, 4, 0.1), r"strategy '2_1_3', which this tuner never selects"),
    ],
)
def test_update_validates_its_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        FixedTuner(S415).update(*args)


def test_select_rejects_non_positive_batch():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        OffTuner().select(0)


def test_fixed_state_round_trip_and_mismatch():
    state = json.loads(json.dumps(FixedTuner(S415, threshold=8).state_dict()))
    FixedTuner(S415, threshold=8).load_state_dict(state)
    with pytest.raises(ValueError, match=r"threshold: saved 8, here 9"):
        FixedTuner(S415, threshold=9).load_state_dict(state)
    with pytest.raises(ValueError, match=r"strategy: saved '4_1_5', here '2_1_3'"):
        FixedTuner("2_1_3", threshold=8).load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved by a 'fixed' tuner, cannot load it into a 'off' tuner"):
        OffTuner().load_state_dict(state)
    with pytest.raises(ValueError, match="not a tuner state_dict"):
        OffTuner().load_state_dict({"rng": []})


def test_reward_window_keeps_the_last_values():
    window = RewardWindow(3)
    assert window.mean == 0.0
    for value in (1.0, 2.0, 3.0, 10.0):
        window.push(value)
    assert list(window.values) == [2.0, 3.0, 10.0]
    assert window.mean == 5.0
    restored = RewardWindow(3)
    restored.load(json.loads(json.dumps(window.to_state())))
    restored.push(4.0)
    window.push(4.0)
    assert restored.to_state() == window.to_state() == {"values": [3.0, 10.0, 4.0], "total": 17.0, "pushes": 5}

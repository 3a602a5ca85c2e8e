import json
import math

import pytest

from tlt.schedulers.tuners import BEGTuner, UCB1Tuner
from tlt.schedulers.tuners.bandits import parse_buckets
from tlt.speculative.strategy import SpecStrategy

STRATEGIES = ["4_1_5", "2_1_3"]
S415, S213 = SpecStrategy(4, 1, 5), SpecStrategy(2, 1, 3)
# buckets [1], [2-4], [21+] of the default (1, 4, 20, inf); 4_1_5 wins at 1 and 3, plain at 64 (see conftest)
BATCHES = [1, 3, 64] * 6000
BEST = {1: "4_1_5", 3: "4_1_5", 64: "None"}


@pytest.mark.parametrize("make", [lambda: BEGTuner(STRATEGIES, seed=0, epsilon=0.05), lambda: UCB1Tuner(STRATEGIES)])
def test_bandits_find_the_best_arm_per_bucket(sim, make):
    picks = sim.drive(make(), sim.Env(seed=1), BATCHES)
    half = len(BATCHES) // 2
    for b, best in BEST.items():
        assert sim.share(picks[half:], BATCHES[half:], b)[best] >= 0.9, (b, sim.share(picks, BATCHES, b))


def test_beg_plays_every_arm_of_a_bucket_first():
    tuner = BEGTuner(STRATEGIES, seed=0)
    for b in (5, 20, 7):  # one bucket [5-20]
        arm = tuner.select(b)
        tuner.update(arm, b, b, 0.01)
    assert [s.pulls for s in tuner.stats[2]] == [1, 1, 1]
    assert [s.pulls for s in tuner.stats[0]] == [0, 0, 0]
    assert tuner.arms[2] == [S415, S213, None]


def test_beg_keeps_exploring_every_arm_in_every_bucket(sim):
    picks = sim.drive(BEGTuner(STRATEGIES, seed=3, epsilon=0.1), sim.Env(seed=4), BATCHES)
    for b in BEST:
        shares = sim.share(picks[len(BATCHES) // 2 :], BATCHES[len(BATCHES) // 2 :], b)
        # epsilon = 0.1 over 2 other arms: ~5% each, i.e. ~75 of the last 1500 pulls per bucket
        assert all(shares[arm] >= 0.025 for arm in ("4_1_5", "2_1_3", "None")), (b, shares)


def test_beg_with_zero_epsilon_is_greedy_after_the_first_round(sim):
    env = sim.Env(seed=5, noise=0.0, acceptance=1.0)  # deterministic: 4_1_5 always accepts 4
    picks = sim.drive(BEGTuner(STRATEGIES, seed=0, epsilon=0.0), env, [2] * 50)
    assert picks[:3] == [S415, S213, None]
    assert picks[3:] == [S415] * 47


def test_rewards_are_tokens_per_second_per_sequence():
    tuner = BEGTuner(STRATEGIES)
    tuner.update(S415, 8, 40, 0.5)
    tuner.update(S415, 16, 40, 0.5)
    assert list(tuner.stats[2][0].rewards.values) == [10.0, 5.0]


def test_ucb1_handles_strategies_sharing_a_verify_count(sim):
    shared = ["4_1_5", "2_2_5"]  # both verify 5 nodes: the reference keyed arms by verify count and crashed
    tuner = UCB1Tuner(shared, seed=0)
    picks = sim.drive(tuner, sim.Env(seed=2), [1, 3, 64] * 40)
    assert {str(p) for p in picks} == {"4_1_5", "2_2_5", "None"}
    assert sum(s.pulls for s in tuner.stats[0]) == 40  # every batch-1 step landed in bucket [1]
    assert all(s.pulls >= 1 for stats in (tuner.stats[0], tuner.stats[1], tuner.stats[3]) for s in stats)


def test_ucb1_score_matches_the_formula():
    tuner = UCB1Tuner(["4_1_5"], buckets=[math.inf], exploration=0.5)
    for arm, tokens in ((S415, 30), (None, 10), (None, 10), (None, 10)):
        tuner.update(arm, 10, tokens, 1.0)  # rewards: 3.0 for SD once, 1.0 for plain three times
    # SD: 3/3 + 0.5 * sqrt(2 ln 4 / 1) = 1.832; plain: 1/3 + 0.5 * sqrt(2 ln 4 / 3) = 0.814
    assert tuner.select(10) == S415
    tuner = UCB1Tuner(["4_1_5"], buckets=[math.inf], exploration=4.0)
    for arm, tokens in ((S415, 30), (S415, 30), (S415, 30), (None, 10)):
        tuner.update(arm, 10, tokens, 1.0)
    # SD: 1 + 4 * sqrt(2 ln 4 / 3) = 4.845; plain: 1/3 + 4 * sqrt(2 ln 4) = 7.0
    assert tuner.select(10) is None


@pytest.mark.parametrize("cls", [BEGTuner, UCB1Tuner])
def test_state_round_trip_continues_identically(sim, cls):
    original = cls(STRATEGIES, seed=11)
    sim.drive(original, sim.Env(seed=6), BATCHES[:900])
    restored = cls(STRATEGIES, seed=999)  # a different seed: the RNG state must come from the state_dict
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    tail = BATCHES[:600]
    assert sim.drive(restored, sim.Env(seed=7), tail) == sim.drive(original, sim.Env(seed=7), tail)


def test_mismatched_state_raises():
    state = json.loads(json.dumps(BEGTuner(STRATEGIES, epsilon=0.1).state_dict()))
    with pytest.raises(ValueError, match=r"arms: saved \[\['4_1_5', '2_1_3', 'off'\]"):
        BEGTuner(["4_1_5", "3_1_4"]).load_state_dict(state)
    with pytest.raises(ValueError, match="epsilon: saved 0.1, here 0.2"):
        BEGTuner(STRATEGIES, epsilon=0.2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"buckets: saved \[1, 4, 20, None\], here \[2, None\]"):
        BEGTuner(STRATEGIES, buckets=[2, "inf"]).load_state_dict(state)
    with pytest.raises(ValueError, match="window: saved 300, here 10"):
        BEGTuner(STRATEGIES, window=10).load_state_dict(state)
    with pytest.raises(ValueError, match="saved by a 'beg' tuner, cannot load it into a 'ucb1' tuner"):
        UCB1Tuner(STRATEGIES).load_state_dict(state)


def test_bucket_strategies_narrow_a_bucket_and_a_lone_arm_is_an_error():
    tuner = BEGTuner(STRATEGIES, buckets=[4, None], bucket_strategies=[STRATEGIES, ["2_1_3"]])
    assert tuner.arms == [[S415, S213, None], [S213, None]]
    with pytest.raises(ValueError, match=r"bucket \[5\+\] would have a single arm \(plain decoding\)"):
        BEGTuner(STRATEGIES, buckets=[4, None], bucket_strategies=[STRATEGIES, []])
    with pytest.raises(ValueError, match=r"bucket \[1\] would have a single arm"):
        UCB1Tuner([])
    with pytest.raises(ValueError, match=r"bucket_strategies\[1\] has \['3_1_4'\], which are not in strategies"):
        BEGTuner(STRATEGIES, buckets=[4, None], bucket_strategies=[STRATEGIES, ["3_1_4"]])
    with pytest.raises(ValueError, match="bucket_strategies has 1 entries but there are 2 buckets"):
        BEGTuner(STRATEGIES, buckets=[4, None], bucket_strategies=[STRATEGIES])


def test_bucket_lookup_follows_upper_bounds():
    tuner = BEGTuner(STRATEGIES)
    assert [tuner.bucket_index(b) for b in (1, 2, 4, 5, 20, 21, 10**6)] == [0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([1, 4, 20], "ending with inf"),
        ([], "ending with inf"),
        ([4, 2, None], "strictly increasing"),
        ([0, None], "must be an integer >= 1, got 0"),
        ([2.5, None], "must be an integer >= 1, got 2.5"),
    ],
)
def test_invalid_buckets(buckets, message):
    with pytest.raises(ValueError, match=message):
        parse_buckets(buckets)


@pytest.mark.parametrize("epsilon", [-0.1, 1.5, "0.1"])
def test_invalid_epsilon(epsilon):
    with pytest.raises(ValueError, match=r"epsilon must be a number in \[0, 1\]"):
        BEGTuner(STRATEGIES, epsilon=epsilon)


def test_invalid_window_and_exploration():
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        BEGTuner(STRATEGIES, window=0)
    with pytest.raises(ValueError, match=r"exploration must be a number in \[0, 10\]"):
        UCB1Tuner(STRATEGIES, exploration=-1)
    with pytest.raises(ValueError, match="duplicates"):
        UCB1Tuner(["4_1_5", "4_1_5"])

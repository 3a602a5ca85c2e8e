import json

import pytest

from tlt.schedulers.tuners import CostModelTuner
from tlt.schedulers.tuners.cost_model import LinearCost, RecentAcceptance
from tlt.speculative.strategy import SpecStrategy

STRATEGIES = ["4_1_5", "2_1_3"]
S415, S213 = SpecStrategy(4, 1, 5), SpecStrategy(2, 1, 3)


def test_linear_cost_fits_a_line_exactly():
    cost = LinearCost(maxlen=8)
    assert cost.predict(4) is None
    for b in (1, 2, 4, 8):
        cost.push(b, 0.01 + 0.002 * b)
    assert cost.predict(16) == pytest.approx(0.042, rel=1e-9)
    assert cost.predict(1) == pytest.approx(0.012, rel=1e-9)


def test_linear_cost_window_forgets_old_points():
    cost = LinearCost(maxlen=3)
    for b, t in ((1, 9.0), (2, 9.0), (4, 1.0), (8, 1.0), (16, 1.0)):
        cost.push(b, t)
    assert [p[0] for p in cost.points] == [4, 8, 16]
    assert cost.predict(100) == pytest.approx(1.0, rel=1e-9)


def test_linear_cost_single_batch_size_is_flat_and_slopes_are_not_negative():
    flat = LinearCost(maxlen=4)
    flat.push(4, 0.5)
    flat.push(4, 0.7)
    assert flat.predict(64) == pytest.approx(0.6)
    falling = LinearCost(maxlen=4)
    falling.push(1, 0.5)
    falling.push(2, 0.3)  # noise that would fit a negative slope: clamped to flat
    assert falling.predict(64) == pytest.approx(0.4)


def test_recent_acceptance_pools_rows_and_expires_old_steps():
    acceptance = RecentAcceptance(maxlen=3, horizon=10)
    for now, accepted, rows in ((0, 1, 1), (5, 12, 4), (6, 0, 1), (7, 3, 2)):
        acceptance.push(now, accepted, rows)
    assert list(acceptance.steps) == [(5, 12, 4), (6, 0, 1), (7, 3, 2)]
    assert acceptance.mean == 15 / 7
    acceptance.expire(now=16)  # steps at or before 16 - 10 = 6 are stale
    assert list(acceptance.steps) == [(7, 3, 2)] and acceptance.mean == 1.5
    acceptance.expire(now=100)
    assert acceptance.mean == 0.0 and acceptance.rows == 0


def test_stale_acceptance_forces_a_remeasure():
    tuner = CostModelTuner(["4_1_5"], min_pulls=1, acceptance_horizon=5, epsilon=0.0, epsilon_min=0.0)
    tuner.update(S415, 4, 4, 0.02)  # SD accepted nothing: plain is better from here
    for _ in range(4):
        assert tuner.select(4) is None
        tuner.update(None, 4, 4, 0.01)
    assert tuner.select(4) == S415  # its only acceptance sample is 5 steps old now


def test_prediction_combines_acceptance_and_cost():
    tuner = CostModelTuner(STRATEGIES, min_pulls=1)
    tuner.update(S415, 4, 4 + 8, 0.02)  # 2 accepted per row
    tuner.update(S415, 4, 4 + 16, 0.02)  # 4 accepted per row
    tuner.update(None, 4, 4, 0.01)
    assert tuner.predicted_tokens_per_second(S415, 4) == pytest.approx(4 * (1 + 3) / 0.02)
    assert tuner.predicted_tokens_per_second(None, 4) == pytest.approx(4 / 0.01)
    assert tuner.predicted_tokens_per_second(S213, 4) is None


def test_acceptance_is_local_to_the_batch_size():
    """The long tail (b = 1) accepts everything, the full batch (b = 64) nothing: rows pooled over all batch
    sizes would predict ~0.06 accepted per row at b = 1 and leave SD off in the tail."""
    tuner = CostModelTuner(STRATEGIES, min_pulls=2)
    for _ in range(3):
        tuner.update(S415, 1, 1 + 4, 0.02)
        tuner.update(S415, 64, 64, 0.2)
        tuner.update(None, 1, 1, 0.01)
        tuner.update(None, 64, 64, 0.05)
    assert tuner.predicted_tokens_per_second(S415, 1) == pytest.approx(5 / 0.02)
    assert tuner.predicted_tokens_per_second(S415, 64) == pytest.approx(64 / 0.2)
    tuner.update(S415, 16, 16 + 16, 0.04)  # b = 16: 1 SD step < min_pulls: pooled rows instead
    assert tuner.predicted_tokens_per_second(S415, 16) == pytest.approx(16 * (1 + 28 / (3 + 3 * 64 + 16)) / 0.04)


def test_acceptance_comes_from_the_batch_sizes_own_octave_once_it_has_samples():
    """The rows left at 2 accept nothing, those of 6-row steps 2 each. Pooled by rows, 2-row steps would predict
    1.5 accepted per row and play SD (2 * 2.5 / 0.015 > 2 / 0.01); their own octave says plain is faster."""
    tuner = CostModelTuner(STRATEGIES, min_pulls=2)
    for _ in range(3):
        tuner.update(S415, 2, 2, 0.015)
        tuner.update(S415, 6, 6 + 12, 0.02)
        tuner.update(None, 2, 2, 0.01)
        tuner.update(None, 6, 6, 0.012)
    assert tuner.predicted_tokens_per_second(S415, 2) == pytest.approx(2 / 0.015)
    assert tuner.predicted_tokens_per_second(S415, 6) == pytest.approx(6 * 3 / 0.02)
    assert tuner.predicted_tokens_per_second(S415, 2) < tuner.predicted_tokens_per_second(None, 2)
    tuner.update(S415, 1, 1 + 4, 0.012)  # b = 1: one SD step < min_pulls: octaves [1] and [2-3] pooled
    assert tuner.predicted_tokens_per_second(S415, 1) == pytest.approx((1 + 4 / 7) / 0.012)


def test_cost_is_fitted_locally_in_log_batch_size():
    """Step time flat up to b = 8, then steep: one line through all points would overprice small batches."""
    tuner = CostModelTuner(STRATEGIES, min_pulls=1)
    for b in (1, 2, 3, 4, 6, 8, 16, 32, 64, 128):
        tuner.update(None, b, b, 0.01 + 0.001 * max(b - 8, 0))
    assert tuner.predicted_tokens_per_second(None, 2) == pytest.approx(2 / 0.01)
    assert tuner.predicted_tokens_per_second(None, 128) == pytest.approx(128 / 0.13, rel=0.05)


def test_sd_on_at_small_batch_and_off_at_large_batch(sim):
    batches = [1, 3, 64] * 3000
    picks = sim.drive(CostModelTuner(STRATEGIES, seed=0), sim.Env(seed=1), batches)
    half = len(batches) // 2
    assert sim.share(picks[half:], batches[half:], 1)["4_1_5"] >= 0.9
    assert sim.share(picks[half:], batches[half:], 3)["4_1_5"] >= 0.9
    assert sim.share(picks[half:], batches[half:], 64)["None"] >= 0.9


def test_shrinking_batch_turns_sd_on_in_the_tail(sim):
    tail = [b for _ in range(40) for b in range(64, 0, -1)]  # 40 rollouts whose batch shrinks from 64 to 1
    picks = sim.drive(CostModelTuner(STRATEGIES, seed=2), sim.Env(seed=3), tail)
    last = picks[-20 * 64 :]
    batches = tail[-20 * 64 :]
    sd_small = [p is not None for p, b in zip(last, batches, strict=True) if b <= 4]
    sd_large = [p is not None for p, b in zip(last, batches, strict=True) if b >= 48]
    assert sum(sd_small) / len(sd_small) >= 0.9
    assert sum(sd_large) / len(sd_large) <= 0.1


def test_adapts_when_acceptance_drifts(sim):
    tuner = CostModelTuner(STRATEGIES, seed=4)
    env = sim.Env(seed=5, acceptance=0.8)
    before = sim.drive(tuner, env, [2] * 1500)
    assert sum(p == S415 for p in before[-500:]) >= 450
    env.acceptance = 0.0  # the drafter went stale: SD only costs now
    stale = sim.drive(tuner, env, [2] * 1500)
    assert sum(p is None for p in stale[300:]) >= 0.9 * 1200
    env.acceptance = 0.8  # retrained drafter: exploration must notice
    fresh = sim.drive(tuner, env, [2] * 3000)
    assert sum(p == S415 for p in fresh[-1000:]) >= 900


def test_every_arm_is_forced_per_power_of_two_range(sim):
    tuner = CostModelTuner(STRATEGIES, seed=0, min_pulls=2, epsilon=0.0, epsilon_min=0.0)
    picks = sim.drive(tuner, sim.Env(seed=0), [5] * 6 + [7] * 10)
    assert picks[:6] == [S415, S415, S213, S213, None, None]  # octave [4-7] forced, then greedy
    assert len(set(picks[6:])) == 1
    assert tuner.select(8) == S415  # a new octave [8-15]: forced again
    assert tuner.pulls_per_octave == [
        [0, 0, 2 + picks[6:].count(S415)],
        [0, 0, 2 + picks[6:].count(S213)],
        [0, 0, 2 + picks[6:].count(None)],
    ]


def test_epsilon_decays_to_its_floor():
    tuner = CostModelTuner(STRATEGIES, epsilon=0.2, epsilon_min=0.05, epsilon_decay=100)
    assert tuner.epsilon == 0.2
    tuner.steps = 100
    assert tuner.epsilon == pytest.approx(0.1)
    tuner.steps = 10_000
    assert tuner.epsilon == 0.05


def test_state_round_trip_continues_identically(sim):
    original = CostModelTuner(STRATEGIES, seed=8)
    sim.drive(original, sim.Env(seed=6), [1, 3, 64] * 400)
    restored = CostModelTuner(STRATEGIES, seed=123)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    tail = [1, 3, 64, 17] * 300
    assert sim.drive(restored, sim.Env(seed=7), tail) == sim.drive(original, sim.Env(seed=7), tail)


def test_mismatched_state_raises():
    state = json.loads(json.dumps(CostModelTuner(STRATEGIES).state_dict()))
    with pytest.raises(ValueError, match=r"arms: saved \['4_1_5', '2_1_3', 'off'\], here \['4_1_5', 'off'\]"):
        CostModelTuner(["4_1_5"]).load_state_dict(state)
    with pytest.raises(ValueError, match="window: saved 128, here 64"):
        CostModelTuner(STRATEGIES, window=64).load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window": 1}, "window must be an integer >= 2"),
        ({"acceptance_window": 0}, "acceptance_window must be an integer >= 1"),
        ({"min_pulls": 0}, "min_pulls must be an integer >= 1"),
        ({"epsilon": 1.5}, r"epsilon must be a number in \[0, 1\]"),
        ({"epsilon": 0.01, "epsilon_min": 0.1}, "epsilon_min must be <= epsilon"),
        ({"epsilon_decay": 0}, "epsilon_decay must be an integer >= 1"),
    ],
)
def test_invalid_options(options, message):
    with pytest.raises(ValueError, match=message):
        CostModelTuner(STRATEGIES, **options)


def test_needs_a_strategy_and_no_duplicates():
    with pytest.raises(ValueError, match="at least one SD strategy"):
        CostModelTuner([])
    with pytest.raises(ValueError, match="duplicates"):
        CostModelTuner(["4_1_5", "4_1_5"])


def test_exploration_skips_arms_predicted_far_slower(sim):
    """With epsilon = 1 every unforced step explores; at b = 64 a 4_1_5 step is predicted ~2x slower than
    plain    and 2_1_3 ~1.4x, so with explore_ratio 0.8 exploration never plays them there (beyond the forced pulls),
    while explore_ratio 0 does."""
    batches = [64] * 400

    def late_share(ratio: float) -> float:
        tuner = CostModelTuner(STRATEGIES, seed=0, epsilon=1.0, epsilon_min=1.0, explore_ratio=ratio)
        picks = sim.drive(tuner, sim.Env(seed=1, noise=0.0), batches)
        return sim.share(picks[200:], batches[200:], 64)["None"]

    assert late_share(0.8) == 1.0
    assert late_share(0.0) < 0.1  # explores the other arms on (almost) every step


def test_explore_ratio_is_validated():
    with pytest.raises(ValueError, match="explore_ratio"):
        CostModelTuner(STRATEGIES, explore_ratio=1.5)


def test_cached_predictions_choose_as_a_fresh_tuner_would(sim):
    """A tuner that has cached its predictions for thousands of steps picks, at every step, what a copy rebuilt
    from its state (nothing cached) picks: arms updated, batch sizes revisited, acceptance samples expiring."""
    tuner = CostModelTuner(STRATEGIES, seed=3, acceptance_horizon=40, acceptance_window=8, epsilon=0.3)
    env = sim.Env(seed=9, acceptance=0.6)
    batches = [b for _ in range(6) for b in (*range(48, 0, -3), 1, 1, 1, 2, 2, 5, 64)]
    for b in batches:
        fresh = CostModelTuner(STRATEGIES, seed=0, acceptance_horizon=40, acceptance_window=8, epsilon=0.3)
        fresh.load_state_dict(tuner.state_dict())
        for arm in tuner.arms:
            for size in (1, 2, b, 64):
                assert tuner.predicted_tokens_per_second(arm, size) == fresh.predicted_tokens_per_second(arm, size)
        arm = tuner.select(b)
        assert fresh.select(b) == arm
        tuner.update(arm, b, *env.step(arm, b))

"""Wilson intervals and the exact McNemar test (scipy.stats.binomtest underneath) against hand-computed values."""

import pytest

from tlt.eval.parity_stats import compare_paired, mcnemar_exact, verdict, wilson_interval


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    [
        (8, 10, (0.49016, 0.94332)),  # p = 0.8: centre 0.71674, half-width 0.22658
        (0, 10, (0.0, 0.27753)),  # no successes: lower bound exactly 0
        (10, 10, (0.72247, 1.0)),  # mirror image of 0/10
        (50, 100, (0.40383, 0.59617)),
    ],
)
def test_wilson_interval_hand_computed(successes, n, expected):
    assert wilson_interval(successes, n) == pytest.approx(expected, abs=1e-5)


def test_wilson_interval_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(0, 0)


@pytest.mark.parametrize(
    ("only_a", "only_b", "expected"),
    [
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        (0, 5, 2 / 32),  # 2 * C(5,0) / 2^5
        (9, 1, 22 / 1024),  # symmetric
        (3, 3, 1.0),  # 2 * 42/64 > 1, capped
        (0, 0, 1.0),  # no discordant pairs: no evidence of a difference
        (0, 1, 1.0),
    ],
)
def test_mcnemar_exact_hand_computed(only_a, only_b, expected):
    assert mcnemar_exact(only_a, only_b) == pytest.approx(expected, rel=1e-12)


def test_compare_paired_counts_discordant_pairs():
    c = compare_paired([1, 1, 0, 0, 1], [1, 0, 1, 1, 1])
    assert (c.n, c.correct_a, c.correct_b, c.only_a, c.only_b) == (5, 3, 4, 1, 2)
    assert c.difference == pytest.approx(0.2) and c.accuracy_b - c.accuracy_a == pytest.approx(c.difference)
    assert c.p_value == 1.0 and not c.differs(0.05)
    assert verdict(c.differs(0.05)) == "no significant difference at alpha=0.05"


def test_compare_paired_detects_a_clear_difference():
    c = compare_paired([0] * 12 + [1] * 8, [1] * 12 + [1] * 8)  # B fixes 12 problems, breaks none
    assert c.p_value == pytest.approx(2 / 2**12) and c.differs(0.05)
    assert verdict(c.differs(0.05)) == "differs"


def test_compare_paired_rejects_bad_input():
    with pytest.raises(ValueError, match="one length"):
        compare_paired([1, 0], [1])
    with pytest.raises(ValueError, match="0 or 1"):
        compare_paired([0.5], [1])

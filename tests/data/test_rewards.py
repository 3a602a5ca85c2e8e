import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlt.data.rewards import (
    extract_answer,
    extract_boxed,
    extract_last_number,
    math_reward,
    math_rewards,
    normalize_answer,
)


def test_extract_boxed_last_complete_with_nested_braces():
    assert extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{{a}{b}} and \\boxed{3") == "{a}{b}"  # the last one never closes
    assert extract_boxed("\\fbox{7}") == "7"
    assert extract_boxed("\\boxed {4}") == "4"
    assert extract_boxed("no box 42") is None
    assert extract_boxed("\\boxed") is None


def test_extract_answer_strict_and_flexible():
    assert extract_answer("so \\boxed{ 12 }.") == "12"
    assert extract_answer("\\boxed{}") is None
    assert extract_answer("The answer is 12.") is None
    assert extract_last_number("I had 3 apples, then 1,234.5 and 7 pears, total -15.") == "-15"
    assert extract_last_number("worth 1,234") == "1234"
    assert extract_last_number("none") is None


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (" 1,234 ", "1234"),
        ("$5$", "5"),
        ("+5", "5"),
        ("-0", "0"),
        ("-0.00", "0.00"),
        ("12.", "12"),
        ("1,23", "1,23"),
        ("-7", "-7"),
    ],
)
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{42}", "42"),
        ("so x = \\boxed{-3}.", "-3"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "\\frac{1}{2}"),
        ("\\boxed{1,234}", "1234"),
        ("\\boxed{+5}", "5"),
        ("\\boxed{-0}", "0"),
        ("\\boxed{$12$.}", "12"),
        ("\\boxed{{7}}", "7"),
        ("\\boxed{\\frac{\\sqrt{4}}{4}}", "\\frac{1}{2}"),
        ("\\boxed{\\$18}", "18"),  # GSM8K-style money and units, graded as a person would
        ("\\boxed{\\$47.50}", "47.5"),
        ("The total is \\boxed{18 dollars}.", "18"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{\\$1,234}", "1234"),
        ("\\boxed{3.5 kg}", "3.5"),
    ],
)
def test_correct_answers_score_one(response, gold):
    assert math_reward(response, gold) == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{41}", "42"),
        ("\\boxed{3}", "-3"),
        ("\\boxed{\\frac{1}{3}}", "0.5"),
        ("42", "42"),  # no box: strict
        ("\\boxed{42", "42"),  # unbalanced
        ("", "42"),
        ("\\boxed{}", "0"),
        ("\\boxed{42} wait, no: \\boxed{43}", "42"),
        ("\\boxed{19 dollars}", "18"),
        ("\\boxed{\\$18.50}", "18"),
        ("\\boxed{1e5}", "1"),  # a unit is a word, not an exponent
    ],
)
def test_wrong_or_unboxed_answers_score_zero(response, gold):
    assert math_reward(response, gold) == 0.0


def test_very_long_and_garbage_outputs():
    assert math_reward("1 + " * 25_000 + "\\boxed{7}", "7") == 1.0
    assert math_reward("\\boxed{7}" + "x" * 100_000, "7") == 0.0  # answer outside the searched tail
    assert math_reward("{" * 100_000, "7") == 0.0
    assert math_reward("\\boxed{" + "(" * 5000 + "}", "7") == 0.0
    assert math_reward(bytes(range(256)).decode("latin-1") * 50, "7") == 0.0


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_junk_never_raises(text):
    assert math_reward(text, "5") in (0.0, 1.0)
    assert math_reward("\\boxed{" + text + "}", "5") in (0.0, 1.0)


def test_reward_in_a_worker_thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(math_reward("\\boxed{0.25}", "\\frac{1}{4}")))
    worker.start()
    worker.join()
    assert out == [1.0]


def test_math_rewards_batch():
    assert math_rewards(["\\boxed{1}", "\\boxed{2}", "none"], ["1", "3", "0"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 responses but 1 gold"):
        math_rewards(["a", "b"], ["1"])


def test_a_grading_failure_is_nan_and_logged_not_a_wrong_answer(monkeypatch, caplog):
    """A grader that raises (a bug, a timeout) must not look like a wrong answer: NaN, a log line, then
    `count_grading_errors` scores it 0 and counts it (before, it silently scored 0.0)."""
    import math

    from tlt.data import rewards

    def broken(gold, pred):
        raise RuntimeError("grader bug")

    monkeypatch.setattr(rewards, "_verify", broken)
    with caplog.at_level("WARNING"):
        score = math_reward("\\boxed{\\frac{1}{2}}", "0.5")  # needs math-verify: the broken grader
    assert math.isnan(score) and "could not grade a response" in caplog.text and "grader bug" in caplog.text
    assert math_reward("\\boxed{7}", "7") == 1.0  # exact matches never reach the grader
    assert rewards.count_grading_errors([1.0, score, 0.0, score]) == ([1.0, 0.0, 0.0, 0.0], 2)

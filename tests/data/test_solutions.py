import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlt.data.solutions import (
    arithmetic_solution,
    arithmetic_steps,
    cot_solution,
    tokenize,
)

from .checks import check_solution, evaluate


def test_chain_sum_restates_the_rest_after_each_addition():
    assert arithmetic_solution("6 + 8 - 5 + 3") == "=14-5+3\n=9+3\n=12\nThe answer is \\boxed{12}."
    assert arithmetic_solution("3 - 9") == "=-6\nThe answer is \\boxed{-6}."


def test_products_multiply_left_to_right():
    assert arithmetic_solution("7 * 8 * 2") == "=56*2\n=112\nThe answer is \\boxed{112}."
    assert arithmetic_solution("3 * 0 * 5") == "=0*5\n=0\nThe answer is \\boxed{0}."


def test_tokenize_unary_minus_and_negated_groups():
    assert tokenize("3 - -5 * -( 2 + 1 )") == [3, "-", -5, "*", "-(", 2, "+", 1, ")"]
    assert tokenize("-4-(1)") == [-4, "-", "(", 1, ")"]
    with pytest.raises(ValueError, match="unexpected character"):
        tokenize("2 ^ 3")


def test_arithmetic_one_reduction_per_line_groups_first_then_precedence():
    assert arithmetic_solution("3 + 4 * 5 - ( 6 - 8 )") == (
        "=3+4*5--2\n=3+20--2\n=23--2\n=25\nThe answer is \\boxed{25}."
    )
    assert arithmetic_solution("-( 2 * 3 ) / 2") == "=-6/2\n=-3\nThe answer is \\boxed{-3}."
    assert arithmetic_solution("( ( 7 ) )") == "The answer is \\boxed{7}."


def test_arithmetic_rejects_inexact_division_and_zero_division():
    with pytest.raises(ValueError, match="not an integer"):
        arithmetic_steps("7 / 2")
    with pytest.raises(ValueError, match="division by zero"):
        arithmetic_steps("7 / ( 1 - 1 )")


def test_cot_solution_replaces_hash_line_with_boxed_answer():
    assert cot_solution("a = 2\nb = 3\n#### 5", "5") == "a = 2\nb = 3\nThe answer is \\boxed{5}."
    assert cot_solution("#### 5", "5") is None


def _random_expression(rng: random.Random, terms: int) -> str:
    if terms == 1:
        return str(rng.randint(-20, 20))
    left = rng.randint(1, terms - 1)
    a, b = _random_expression(rng, left), _random_expression(rng, terms - left)
    a = f"( {a} )" if rng.random() < 0.3 else a
    b = f"-( {b} )" if rng.random() < 0.3 else b
    return f"{a} {rng.choice(['+', '-', '*'])} {b}"


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), terms=st.integers(1, 7))
def test_arithmetic_every_line_equals_the_expression(seed, terms):
    expression = _random_expression(random.Random(seed), terms)
    answer = evaluate(expression)
    solution = arithmetic_solution(expression)
    check_solution(solution, str(int(answer)), expression)
    assert solution.count("\n") == expression.count(" + ") + expression.count(" - ") + expression.count(" * ")


@settings(max_examples=100, deadline=None)
@given(terms=st.lists(st.integers(-999, 999), min_size=2, max_size=12), data=st.data())
def test_chain_sum_every_line_is_true_and_one_line_per_operator(terms, data):
    ops = data.draw(st.lists(st.sampled_from(["+", "-", "*"]), min_size=len(terms) - 1, max_size=len(terms) - 1))
    expression = " ".join([str(terms[0])] + [f"{op} {t}" for op, t in zip(ops, terms[1:], strict=True)])
    solution = arithmetic_solution(expression)
    check_solution(solution, str(int(evaluate(expression))), expression)
    assert solution.count("\n") == len(terms) - 1

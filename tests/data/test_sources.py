import pytest

from tlt.data import sources
from tlt.data.solutions import tokenize
from tlt.data.sources import GymKnobs, gym_problems, gym_seed, knobs, to_problem
from tlt.data.tasks import GYM_FAMILIES

from .checks import check_solution, evaluate


def _expression(question: str) -> str:
    prefix = next(p for p in ("Calculate ", "Add from left to right: ") if question.startswith(p))
    assert question.endswith(".")
    return question.removeprefix(prefix).removesuffix(".")


def test_one_expression_gets_one_solution_whatever_the_family():
    chain = to_problem("chain_sum", 1, {"answer": "6", "metadata": {"expression": "3 + 4 - 1"}})
    basic = to_problem("basic_arithmetic", 1, {"answer": "6", "metadata": {"expression": "3 + 4 - 1"}})
    assert chain.question != basic.question
    assert chain.solution == basic.solution == "=7-1\n=6\nThe answer is \\boxed{6}."


def test_knobs_exact_levels():
    assert knobs("chain_sum", 1) == GymKnobs(num_terms=3, num_digits=1)
    assert knobs("chain_sum", 12) == GymKnobs(num_terms=14, num_digits=1)
    assert knobs("basic_arithmetic", 5) == GymKnobs(num_terms=7, num_digits=1)
    assert knobs("products", 1) == GymKnobs(num_terms=2, num_digits=1)
    assert knobs("products", 9) == GymKnobs(num_terms=4, num_digits=1)


@pytest.mark.parametrize("family", ["chain_sum", "basic_arithmetic", "products"])
def test_knobs_never_get_easier(family):
    levels = [knobs(family, d) for d in range(1, 40)]
    for easy, hard in zip(levels, levels[1:], strict=False):
        assert hard.num_terms >= easy.num_terms and hard.num_digits >= easy.num_digits
    assert levels[-1] != levels[0]


def test_knobs_errors_are_actionable():
    with pytest.raises(ValueError, match="difficulty must be >= 1"):
        knobs("chain_sum", 0)
    with pytest.raises(ValueError, match="allowed: chain_sum"):
        knobs("calculus", 1)


def test_gym_seed_streams_are_far_apart():
    a, b = gym_seed("x", 0), gym_seed("x", 1)
    assert a % 2**32 == 0 and b % 2**32 == 0 and a != b
    assert gym_seed("x", 0) == a


@pytest.mark.parametrize("family", ["chain_sum", "basic_arithmetic", "products"])
@pytest.mark.parametrize("difficulty", [1, 2, 5, 9])
def test_every_solution_line_is_true_arithmetic(family, difficulty):
    problems = gym_problems(family, difficulty, 12, seed=3)
    assert len(problems) == 12
    for p in problems:
        assert (p.family, p.difficulty) == (family, difficulty)
        expression = _expression(p.question)
        assert evaluate(expression) == int(p.answer)
        check_solution(p.solution, p.answer, expression)
        assert len(tokenize(expression)) == 2 * knobs(family, difficulty).num_terms - 1 or family == "basic_arithmetic"


def test_gym_problems_deterministic_by_seed():
    assert gym_problems("chain_sum", 2, 10, seed=1) == gym_problems("chain_sum", 2, 10, seed=1)
    assert gym_problems("chain_sum", 2, 10, seed=1) != gym_problems("chain_sum", 2, 10, seed=2)


def test_solution_length_grows_with_difficulty():
    for family in ("chain_sum", "basic_arithmetic", "products"):
        mean = [sum(len(p.solution) for p in gym_problems(family, d, 20, seed=0)) / 20 for d in (1, 4, 8)]
        assert mean[0] < mean[1] < mean[2], (family, mean)


def test_gsm_symbolic_uses_the_datasets_reasoning():
    problems = gym_problems("gsm_symbolic", 1, 5, seed=0)
    for p in problems:
        assert p.difficulty == 1 and p.family == "gsm_symbolic"
        assert "Give the result" not in p.question
        assert p.solution is None or p.solution.endswith(f"The answer is \\boxed{{{p.answer}}}.")
    assert any(p.solution and "\n" in p.solution for p in problems)


def test_to_problem_drops_inexact_basic_arithmetic():
    item = {"answer": "3", "metadata": {"expression": "7 / 2"}}
    assert to_problem("basic_arithmetic", 1, item) is None
    item = {"answer": "-2", "metadata": {"expression": "4 - 6"}}
    assert to_problem("basic_arithmetic", 1, item).solution == "=-2\nThe answer is \\boxed{-2}."


def test_to_problem_drops_answer_disagreement():
    assert to_problem("chain_sum", 1, {"answer": "9", "metadata": {"expression": "4 + 4"}}) is None


def test_all_gym_families_generate():
    for family in GYM_FAMILIES:
        assert len(gym_problems(family, 1, 2, seed=0)) == 2


def test_stream_skips_items_reasoning_gym_cannot_build(monkeypatch):
    real = sources._dataset

    class Flaky:
        def __init__(self, *args):
            self.inner = real(*args)

        def __getitem__(self, index):
            if index % 2 == 0:
                raise ZeroDivisionError("integer division or modulo by zero")
            return self.inner[index]

    monkeypatch.setattr(sources, "_dataset", lambda *args: Flaky(*args))
    stream = sources.gym_stream("chain_sum", 1, gym_seed("flaky"))
    assert len([next(stream) for _ in range(5)]) == 5


def test_any_reasoning_gym_family_gives_problems_and_unknown_ones_are_named_at_config_load():
    """Families tlt has no solutions for come with reasoning-gym's defaults, one level, question and answer only
    (held-out-family evaluation without a hand-written JSONL); before, anything but the four failed."""
    from tlt.config import ConfigError, load_config
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.data.tasks import gym_family_names

    assert {"gcd", "lcm", "decimal_arithmetic", "chain_sum"} <= set(gym_family_names())
    cfg = load_config(None, ["data.families=[gcd,lcm]", "data.weights=[1,1]"])
    problems = heldout_problems(task_mix(cfg.data), 8, 0)
    assert {p.family for p in problems} == {"gcd", "lcm"} and all(p.difficulty == 1 for p in problems)
    assert all(
        p.solution is None and p.answer.isdigit() and "GCD" in p.question or "LCM" in p.question for p in problems
    )
    with pytest.raises(ConfigError, match=r"data.families: got \['nope'\]; allowed: reasoning-gym datasets: .*gcd"):
        load_config(None, ["data.families=[nope,gcd]", "data.weights=[1,1]"])


def test_bootstrap_needs_a_family_it_has_solutions_for(tmp_path):
    from tlt.config import ConfigError, load_config
    from tlt.training.bootstrap import run_bootstrap

    cfg = load_config(None, ["data.families=[gcd]", "data.weights=[1]", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="tlt bootstrap fine-tunes on step-by-step solutions"):
        run_bootstrap(cfg)

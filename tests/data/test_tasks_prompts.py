import pytest

from tlt.data.prompts import format_prompt, format_response
from tlt.data.tasks import DEFAULT_MIX, TaskMix


def test_difficulty_weights_geometric():
    assert TaskMix(("chain_sum",), (1.0,), 3, 0.5).difficulty_weights() == (1.0, 0.5, 0.25)
    assert DEFAULT_MIX.difficulty_weights()[0] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"families": ()}, "families is empty"),
        ({"families": ("algebra",), "weights": (1.0,)}, "unknown \\['algebra'\\]"),
        ({"families": ("products", "products"), "weights": (1.0, 1.0)}, "twice"),
        ({"weights": (1.0,)}, "one weight per family"),
        ({"weights": (0.0, 0.0, 0.0)}, "positive sum"),
        ({"weights": (1.0, -1.0, 1.0)}, "positive sum"),
        ({"max_difficulty": 0}, "max_difficulty"),
        ({"difficulty_decay": 0.0}, "difficulty_decay"),
        ({"difficulty_decay": 1.5}, "difficulty_decay"),
    ],
)
def test_task_mix_validation(kwargs, message):
    fields = {
        "families": DEFAULT_MIX.families,
        "weights": DEFAULT_MIX.weights,
        "max_difficulty": 12,
        "difficulty_decay": 0.5,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        TaskMix(**fields)


def test_prompt_and_response_format():
    prompt = format_prompt(" Calculate 1 + 2. ")
    assert prompt == "Question: Calculate 1 + 2.\nSolve step by step, final answer in \\boxed{}.\nSolution:\n"
    assert format_response("1 + 2 = 3\nThe answer is \\boxed{3}.\n") == "1 + 2 = 3\nThe answer is \\boxed{3}."

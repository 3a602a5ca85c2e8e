import json

import pytest

from tlt.data.jsonl import read_jsonl, write_jsonl
from tlt.data.tasks import MathProblem

PROBLEMS = [
    MathProblem("Calculate 1 + 2.", "3", "chain_sum", 1, "1 + 2 = 3\nThe answer is \\boxed{3}."),
    MathProblem("Calculate 4 * 5.", "20", "products", 2, "4 * 5 = 20\nThe answer is \\boxed{20}."),
    MathProblem("How many?", "7", "gsm_symbolic", 1, None),
]


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_gsm8k_round_trip(tmp_path):
    path = tmp_path / "sub" / "heldout.jsonl"
    write_jsonl(PROBLEMS, path, fmt="gsm8k")
    assert read_jsonl(path, "gsm8k") == PROBLEMS
    first = json.loads(path.read_text().splitlines()[0])
    assert first["answer"] == "1 + 2 = 3\n#### 3"
    assert [p.name for p in path.parent.iterdir()] == ["heldout.jsonl"]  # no temp file left


def test_math_round_trip_keeps_answers(tmp_path):
    path = tmp_path / "math.jsonl"
    write_jsonl(PROBLEMS, path, fmt="math")
    back = read_jsonl(path, "math")
    assert back[:2] == PROBLEMS[:2]
    assert back[2] == MathProblem("How many?", "7", "gsm_symbolic", 1, "The answer is \\boxed{7}.")
    assert json.loads(path.read_text().splitlines()[1])["level"] == "Level 2"


def test_gsm8k_strips_calculator_annotations(tmp_path):
    record = {"question": "Q?", "answer": "She has 2*3=<<2*3=6>>6 eggs.\n#### 1,006"}
    path = _write_lines(tmp_path / "g.jsonl", [json.dumps(record), ""])
    assert read_jsonl(path, "gsm8k") == [
        MathProblem("Q?", "1006", "gsm8k", 1, "She has 2*3=6 eggs.\nThe answer is \\boxed{1006}.")
    ]


def test_math_answer_is_last_boxed_with_nested_braces(tmp_path):
    record = {
        "problem": "P",
        "solution": "Try \\boxed{1}. So $\\boxed{\\frac{1}{\\sqrt{2}}}$.",
        "level": "Level 4",
    }
    path = _write_lines(tmp_path / "m.jsonl", [json.dumps(record)])
    (problem,) = read_jsonl(path, "math")
    assert (problem.answer, problem.family, problem.difficulty) == ("\\frac{1}{\\sqrt{2}}", "math", 4)


@pytest.mark.parametrize(
    ("fmt", "bad"),
    [
        ("gsm8k", "{not json"),
        ("gsm8k", json.dumps(["a list"])),
        ("gsm8k", json.dumps({"question": "Q"})),
        ("gsm8k", json.dumps({"question": "Q", "answer": "no hash line"})),
        ("math", json.dumps({"problem": "P", "solution": "no box"})),
        ("math", json.dumps({"problem": "P", "solution": "\\boxed{1"})),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, fmt, bad):
    good = {
        "gsm8k": {"question": "Q", "answer": "#### 1"},
        "math": {"problem": "P", "solution": "\\boxed{1}"},
    }
    path = _write_lines(tmp_path / "bad.jsonl", [json.dumps(good[fmt]), "", bad])
    with pytest.raises(ValueError, match=f"bad.jsonl:3: malformed {fmt}"):
        read_jsonl(path, fmt)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl", "gsm8k")
    with pytest.raises(ValueError, match="allowed: gsm8k, math"):
        write_jsonl(PROBLEMS, tmp_path / "x.jsonl", fmt="csv")
    assert not (tmp_path / "x.jsonl").exists()

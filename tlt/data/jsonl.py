"""Local JSONL problem files in GSM8K format and MATH format, read and written.

GSM8K: {"question": ..., "answer": "<reasoning with <<calc>> annotations>\\n#### N"}.
MATH:  {"problem": ..., "solution": "... \\boxed{...} ...", "level": "Level 3"}; answer = last boxed content.
Written files carry two extra keys, "family" and "difficulty", so that a round trip is exact; readers use
them when present (lm-eval ignores them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from tlt.data.rewards import extract_boxed
from tlt.data.solutions import final_line
from tlt.data.tasks import MathProblem
from tlt.files import atomic_write_text

Format = Literal["gsm8k", "math"]


class DataError(ValueError):
    """A data file a user can fix: the message names the file and line."""


_CALC = re.compile(r"<<[^<>]*>>")
_LEVEL = re.compile(r"(\d+)")


def _text_field(obj: dict, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'needs a non-empty string field "{key}"')
    return value


def _extras(obj: dict, family: str, difficulty: int) -> tuple[str, int]:
    family = obj.get("family", family)
    difficulty = obj.get("difficulty", difficulty)
    if not isinstance(family, str) or not isinstance(difficulty, int) or difficulty < 1:
        raise ValueError('"family" must be a string and "difficulty" an integer >= 1')
    return family, difficulty


def gsm8k_problem(obj: dict) -> MathProblem:
    """A GSM8K record: answer after the last "####", reasoning without <<...>> calculator annotations."""
    question, answer_text = _text_field(obj, "question"), _text_field(obj, "answer")
    body, sep, answer = answer_text.rpartition("####")
    answer = answer.strip().replace(",", "")
    if not sep or not answer:
        raise ValueError('"answer" must end with a line "#### <final answer>"')
    body = _CALC.sub("", body).strip()
    solution = f"{body}\n{final_line(answer)}" if body else None
    family, difficulty = _extras(obj, "gsm8k", 1)
    return MathProblem(question.strip(), answer, family, difficulty, solution)


def math_problem(obj: dict) -> MathProblem:
    """A MATH record: answer = content of the last \\boxed{...} of the solution, level from "Level N"."""
    problem, solution = _text_field(obj, "problem"), _text_field(obj, "solution")
    answer = extract_boxed(solution)
    if answer is None or not answer.strip():
        raise ValueError('"solution" has no complete \\boxed{...} answer')
    level = _LEVEL.search(str(obj.get("level", "")))
    family, difficulty = _extras(obj, "math", max(int(level.group(1)), 1) if level else 1)
    return MathProblem(problem.strip(), answer.strip(), family, difficulty, solution.strip())


_READERS = {"gsm8k": gsm8k_problem, "math": math_problem}


def read_jsonl(path: str | Path, fmt: Format) -> list[MathProblem]:
    """All problems of a JSONL file; blank lines skipped, a malformed line raises ValueError(path:line)."""
    if fmt not in _READERS:
        raise ValueError(f"unknown JSONL format {fmt!r}; allowed: gsm8k, math")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {fmt} JSONL file at {path}")
    problems = []
    for lineno, line in _records(path):
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
            problems.append(_READERS[fmt](obj))
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise DataError(f"{path}:{lineno}: malformed {fmt} record: {e}") from e
    return problems


def _records(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of each non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, line


def detect_format(path: str | Path) -> Format:
    """ "gsm8k" or "math" from the keys of the first record; every line is then checked by read_jsonl."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no JSONL data file at {path}")
    for lineno, line in _records(path):
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON: {e}") from e
        if isinstance(obj, dict) and "question" in obj:
            return "gsm8k"
        if isinstance(obj, dict) and "problem" in obj:
            return "math"
        raise DataError(
            f'{path}:{lineno}: neither GSM8K ("question", "answer") nor MATH ("problem", "solution") format'
        )
    raise DataError(f"{path} holds no records")


def read_problems(path: str | Path) -> list[MathProblem]:
    """All problems of a GSM8K- or MATH-format JSONL file (`detect_format`, then `read_jsonl`)."""
    return read_jsonl(path, detect_format(path))


def _body(solution: str | None, answer: str) -> str:
    """The reasoning part of one of our solutions (its final boxed line removed)."""
    if solution is None:
        return ""
    return solution.removesuffix(final_line(answer)).strip()


def to_record(problem: MathProblem, fmt: Format) -> dict:
    extras = {"family": problem.family, "difficulty": problem.difficulty}
    if fmt == "gsm8k":
        if "\n" in problem.answer:
            raise ValueError(f"GSM8K answers are one line; got {problem.answer!r}")
        body = _body(problem.solution, problem.answer)
        answer = f"{body}\n#### {problem.answer}" if body else f"#### {problem.answer}"
        return {"question": problem.question, "answer": answer, **extras}
    if fmt == "math":
        solution = problem.solution or final_line(problem.answer)
        return {
            "problem": problem.question,
            "solution": solution,
            "level": f"Level {problem.difficulty}",
            **extras,
        }
    raise ValueError(f"unknown JSONL format {fmt!r}; allowed: gsm8k, math")


def write_jsonl(problems: list[MathProblem], path: str | Path, fmt: Format = "gsm8k") -> None:
    """Write `problems` as GSM8K- or MATH-format JSONL, atomically (temp file in the folder, then replace)."""
    path = Path(path)
    lines = [json.dumps(to_record(p, fmt), ensure_ascii=False) + "\n" for p in problems]
    atomic_write_text(path, "".join(lines))

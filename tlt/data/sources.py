"""reasoning-gym task sources: our integer difficulty mapped onto each dataset's knobs, solutions attached.

reasoning-gym items are seeded as `random.Random(dataset_seed + index)`, so two datasets whose seed ranges
[seed, seed + size) overlap produce identical items. `gym_seed` spaces the seeds of different
(split seed, family, difficulty) streams 2**32 apart so their ranges never meet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from tlt.data.solutions import arithmetic_solution, compact, cot_solution
from tlt.data.tasks import GYM_FAMILIES, MathProblem, gym_family_names, unknown_families

# One question form per family; every family is solved in the same reduction format (tlt.data.solutions), so an
# expression that two families can produce ("3 + 4 - 1") always gets the same solution.
QUESTIONS = {
    "chain_sum": "Add from left to right: {expression}.",
    "basic_arithmetic": "Calculate {expression}.",
    "products": "Calculate {expression}.",
}
_CHUNK = 512  # items per reasoning-gym dataset object (gsm_symbolic precomputes `size` task indices)
_GSM_SUFFIX = " Give the result as your final answer. Do not include units."


@dataclass(frozen=True)
class GymKnobs:
    """The reasoning-gym config for one difficulty level: exact term and digit counts (min = max)."""

    num_terms: int
    num_digits: int


def knobs(family: str, difficulty: int) -> GymKnobs:
    """Difficulty d >= 1 -> dataset knobs: one more term per level, single-digit numbers.

    Single digits keep every line's arithmetic within reach of a tiny model (a running total plus or times one
    digit); difficulty is the number of terms, and response length grows with its square (one line per term,
    each restating what is left), so the difficulty mix alone sets the length distribution.
    """
    if difficulty < 1:
        raise ValueError(f"difficulty must be >= 1, got {difficulty}")
    d = difficulty
    if family in ("chain_sum", "basic_arithmetic"):
        return GymKnobs(num_terms=2 + d, num_digits=1)
    if family == "products":  # products grow fast: one more factor every third level
        return GymKnobs(num_terms=2 + (d - 1) // 3, num_digits=1)
    if family == "gsm_symbolic":
        return GymKnobs(num_terms=0, num_digits=0)
    raise ValueError(f"unknown task family {family!r}; allowed: {', '.join(GYM_FAMILIES)}")


def max_level(family: str) -> int | None:
    """The highest meaningful difficulty of a family (None: unbounded): 1 for gsm_symbolic and for the
    reasoning-gym families tlt has no difficulty mapping for."""
    return None if family in ("chain_sum", "basic_arithmetic", "products") else 1


def gym_seed(*parts: object) -> int:
    """A stable seed for the stream named `parts`; a multiple of 2**32, so streams' item seeds never meet."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") << 32


def _config(family: str, difficulty: int) -> dict:
    if family == "gsm_symbolic":
        return {"difficulty": 1.0}
    if family not in GYM_FAMILIES:  # another reasoning-gym dataset: its default settings
        return {}
    k = knobs(family, difficulty)
    cfg = {
        "min_terms": k.num_terms,
        "max_terms": k.num_terms,
        "min_digits": k.num_digits,
        "max_digits": k.num_digits,
    }
    if family == "basic_arithmetic":
        cfg |= {
            "allow_parentheses": difficulty >= 3,
            "allow_negation": difficulty >= 5,
            "whitespace": "single",
            "format_style": "simple",
        }
    return cfg


def _dataset(family: str, difficulty: int, seed: int, size: int):
    import reasoning_gym  # heavy import (all task generators); only when problems are generated

    return reasoning_gym.create_dataset(family, seed=seed, size=size, **_config(family, difficulty))


def to_problem(family: str, difficulty: int, item: dict) -> MathProblem | None:
    """A reasoning-gym item as a MathProblem with our solution; None if we can't solve it exactly.

    basic_arithmetic items whose divisions are not exact (reasoning-gym evaluates them with floor division)
    are dropped, so that every solution line is a true equation and the answer agrees with the dataset's.
    """
    meta, answer = item["metadata"], item["answer"]
    if family not in GYM_FAMILIES:  # question and answer only: no solution to SFT on
        return MathProblem(item["question"], str(answer), family, 1, None)
    if family == "gsm_symbolic":
        question = item["question"].removesuffix(_GSM_SUFFIX)
        return MathProblem(question, answer, family, 1, cot_solution(meta.get("answer_cot", ""), answer))
    try:
        solution = arithmetic_solution(meta["expression"])
    except ValueError:
        return None
    if not solution.endswith(f"\\boxed{{{answer}}}."):
        return None
    question = QUESTIONS[family].format(expression=compact(meta["expression"]))
    return MathProblem(question, answer, family, difficulty, solution)


def gym_stream(family: str, difficulty: int, seed: int) -> Iterator[MathProblem]:
    """Endless deterministic stream of problems of one family and level; `seed` from `gym_seed`."""
    if unknown_families([family]):
        raise ValueError(f"unknown task family {family!r}; reasoning-gym has: {', '.join(gym_family_names())}")
    start = seed
    while True:
        dataset = _dataset(family, difficulty, start, _CHUNK)
        for index in range(_CHUNK):
            try:
                item = dataset[index]
            except ZeroDivisionError:  # basic_arithmetic can build "x / ( 3 - 3 )"; skip that item
                continue
            problem = to_problem(family, difficulty, item)
            if problem is not None:
                yield problem
        start += _CHUNK


def gym_problems(family: str, difficulty: int, n: int, seed: int) -> list[MathProblem]:
    """`n` problems of one family at one difficulty, deterministic in `seed`."""
    stream = gym_stream(family, difficulty, gym_seed("gym_problems", seed, family, difficulty))
    return [next(stream) for _ in range(n)]

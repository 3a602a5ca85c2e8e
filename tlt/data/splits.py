"""Drawing problems from a TaskMix, and the disjoint training / held-out splits.

The split is by question: a question belongs to the held-out split iff a hash of its text falls in the
held-out bucket (1 in HELDOUT_BUCKETS). Training never yields a held-out question and vice versa, whatever the
sizes and seeds, which matters because easy levels have few distinct questions (e.g. "Calculate 3 + 4 - 1.").
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator

from tlt.data.sources import gym_seed, gym_stream, max_level
from tlt.data.tasks import MathProblem, TaskMix

HELDOUT_BUCKETS = 8
_MAX_DRAWS_PER_PROBLEM = 200  # a split that keeps fewer than 1 in 200 draws is exhausted, not slow


def is_heldout(question: str) -> bool:
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_BUCKETS == 0


def _draws(mix: TaskMix, seed: int, tag: str) -> Iterator[MathProblem]:
    """Endless stream: family by weight, difficulty by the mix's geometric law, then the next problem."""
    rng = random.Random(gym_seed("mix", tag, seed))
    levels = range(1, mix.max_difficulty + 1)
    streams: dict[tuple[str, int], Iterator[MathProblem]] = {}
    while True:
        family = rng.choices(mix.families, weights=mix.weights)[0]
        level = rng.choices(levels, weights=mix.difficulty_weights())[0]
        level = min(level, max_level(family) or level)
        key = (family, level)
        if key not in streams:
            streams[key] = gym_stream(family, level, gym_seed("stream", tag, seed, family, level))
        yield next(streams[key])


def _take(draws: Iterator[MathProblem], n: int, keep: Callable[[MathProblem], bool]) -> list[MathProblem]:
    out: list[MathProblem] = []
    for _ in range(n * _MAX_DRAWS_PER_PROBLEM):
        if len(out) == n:
            return out
        problem = next(draws)
        if keep(problem):
            out.append(problem)
    if len(out) < n:
        raise ValueError(
            f"only {len(out)} of {n} problems found in {n * _MAX_DRAWS_PER_PROBLEM} draws; the mix has too "
            "few distinct questions for this split: raise max_difficulty or difficulty_decay, or ask fewer"
        )
    return out


def sample_problems(mix: TaskMix, n: int, seed: int) -> list[MathProblem]:
    """`n` problems drawn from `mix` (no split filtering), deterministic in `seed`."""
    return _take(_draws(mix, seed, "sample"), n, lambda p: True)


def training_problems(mix: TaskMix, n: int, seed: int) -> list[MathProblem]:
    """`n` training problems; none of their questions is ever in a held-out set. Repeats are allowed."""
    return _take(_draws(mix, seed, "train"), n, lambda p: not is_heldout(p.question))


def rl_problems(data_cfg) -> list[MathProblem]:
    """The prompts of `tlt train` (a `tlt.config.DataConfig`): the problems of the `data.jsonl` files (GSM8K or
    MATH format, in file order; the RL sampler shuffles them) when any are given, else `data.train_size`
    generated training problems of the task mix."""
    if data_cfg.jsonl:
        from tlt.data.jsonl import read_problems

        return [problem for path in data_cfg.jsonl for problem in read_problems(path)]
    return training_problems(task_mix(data_cfg), data_cfg.train_size, data_cfg.seed)


def heldout_problems(mix: TaskMix, n: int, seed: int) -> list[MathProblem]:
    """`n` distinct held-out problems, disjoint from every training set."""
    seen: set[str] = set()

    def keep(p: MathProblem) -> bool:
        if not is_heldout(p.question) or p.question in seen:
            return False
        seen.add(p.question)
        return True

    return _take(_draws(mix, seed, "heldout"), n, keep)


def task_mix(data_cfg) -> TaskMix:
    """The TaskMix of a `tlt.config.DataConfig` (families, weights, max_difficulty, difficulty_decay)."""
    return TaskMix(
        tuple(data_cfg.families),
        tuple(float(w) for w in data_cfg.weights),
        data_cfg.max_difficulty,
        data_cfg.difficulty_decay,
    )

"""The one plain-text prompt format (no chat template: the tokenizer is tiny and built by us).

The instruction is kept to one short line because every prompt token costs rollout time.
"""

from __future__ import annotations

PROMPT_TEMPLATE = "Question: {question}\nSolve step by step, final answer in \\boxed{{}}.\nSolution:\n"


def format_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question.strip())


def format_response(solution: str) -> str:
    """The text the model is trained to emit right after `format_prompt(...)` (EOS is the trainer's job)."""
    return solution.strip()

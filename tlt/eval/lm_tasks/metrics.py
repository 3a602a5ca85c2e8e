"""Prompt, gold answer and per-sample metrics of the tlt lm-eval tasks, referenced from their YAMLs.

The metrics reuse tlt's reward code, so an lm-eval score and an RL reward agree on every response:
strict = last boxed answer equals the gold after normalisation, flexible = last number equals it
(lm-eval's "flexible-extract"), math_verify = `tlt.data.rewards.math_reward` (exact, then math-verify).
"""

from __future__ import annotations

from tlt.data.jsonl import gsm8k_problem, math_problem
from tlt.data.prompts import format_prompt
from tlt.data.rewards import count_grading_errors, extract_answer, extract_last_number, math_reward, normalize_answer

METRICS = ("strict", "flexible", "math_verify")


def score(response: str, gold: str) -> dict[str, float]:
    """Every metric of one response against the gold answer, 0.0 or 1.0 each."""
    gold_n = normalize_answer(gold)
    boxed = extract_answer(response)
    return {
        "strict": float(boxed is not None and normalize_answer(boxed) == gold_n),
        "flexible": float(extract_last_number(response) == gold_n),
        "math_verify": count_grading_errors([math_reward(response, gold)])[0][0],  # ungradable: 0, logged
    }


def gsm8k_prompt(doc: dict) -> str:
    return format_prompt(doc["question"])


def gsm8k_answer(doc: dict) -> str:
    return gsm8k_problem(doc).answer


def gsm8k_results(doc: dict, results: list[str]) -> dict[str, float]:
    return score(results[0], gsm8k_answer(doc))


def math_prompt(doc: dict) -> str:
    return format_prompt(doc["problem"])


def math_answer(doc: dict) -> str:
    return math_problem(doc).answer


def math_results(doc: dict, results: list[str]) -> dict[str, float]:
    return score(results[0], math_answer(doc))

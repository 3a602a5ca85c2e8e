"""Math answer extraction and the 0/1 correctness reward (shared by RL rewards and the lm-eval harness).

`math_reward` takes the last `\\boxed{...}` of the response (nested braces handled), accepts it when it
equals the gold answer after normalisation, and otherwise asks math-verify (0.5 vs 1/2 vs \\frac{1}{2}).
It never raises and its time is bounded: only the last MAX_TAIL_CHARS of a response are searched and only
answers up to MAX_ANSWER_CHARS go to the parser (math-verify's timeouts use SIGALRM, which works only in the
main thread; elsewhere they are off, so the length cap is the bound). A response it could not grade (the
grader raised: a bug or a timeout, not a wrong answer) scores NaN and is logged; `count_grading_errors`
turns NaNs into 0 and counts them, so the RL step metrics (`reward_errors`) and evaluation reports show
them instead of passing them off as wrong answers.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from functools import lru_cache

log = logging.getLogger(__name__)

MAX_TAIL_CHARS = 2000
MAX_ANSWER_CHARS = 200
VERIFY_TIMEOUT_S = 2
_BOX_MARKERS = ("\\boxed", "\\fbox")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_NUMBER = re.compile(r"-?\d(?:[\d,]*\d)?(?:\.\d+)?")


def _braced(text: str, open_at: int) -> str | None:
    """Content of the brace group opening at text[open_at] == "{", or None if it never closes."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` (or `\\fbox{...}`) in `text`; None if there is none."""
    end = len(text)
    while True:
        at, marker = max((text.rfind(m, 0, end), m) for m in _BOX_MARKERS)
        if at < 0:
            return None
        brace = at + len(marker)
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            content = _braced(text, brace)
            if content is not None:
                return content
        end = at


def extract_answer(text: str) -> str | None:
    """Strict extraction: the stripped content of the last boxed answer, None if absent or empty."""
    content = extract_boxed(text[-MAX_TAIL_CHARS:])
    content = content.strip() if content is not None else None
    return content or None


def extract_last_number(text: str) -> str | None:
    """Flexible extraction (lm-eval "flexible-extract"): the last number in the text, "," removed."""
    matches = _NUMBER.findall(text[-MAX_TAIL_CHARS:])
    return normalize_answer(matches[-1]) if matches else None


_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}")  # \text{dollars} -> dollars
_NUMBER_AND_UNIT = re.compile(r"^(-?\d[\d,]*(?:\.\d+)?)(?:[A-Za-z]+\.?)+$")  # 18dollars, 3.5kg, 12ft.


def normalize_answer(answer: str) -> str:
    """Canonical form: no spaces, `$` (escaped or not) or trailing `.`; a number followed by a unit word keeps
    the number (a GSM8K-style "\\$18", "18 dollars" or "18 \\text{ apples}" is 18, as a person would grade
    it); "1,234" -> "1234", "+5" -> "5", "-0" -> "0"."""
    s = _TEXT.sub(r"\1", "".join(answer.split()))
    s = s.replace("\\$", "").replace("$", "").rstrip(".")
    unit = _NUMBER_AND_UNIT.match(s)
    if unit:
        s = unit.group(1)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    if s.startswith("+"):
        s = s[1:]
    if re.fullmatch(r"-0+(\.0+)?", s):
        s = s[1:]
    return s


@lru_cache(maxsize=4096)
def _parse(answer: str, timeout: int | None) -> tuple:
    from math_verify import parse

    return tuple(parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout))


def _verify(gold: str, pred: str) -> bool:
    from math_verify import verify

    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed, pred_parsed = _parse(gold, timeout), _parse(pred, timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=timeout))


def math_reward(response: str, gold: str) -> float:
    """1.0 if the last boxed answer of `response` equals `gold` (exactly or per math-verify), else 0.0; NaN
    (logged) when grading raised."""
    try:
        pred = extract_answer(response)
        if pred is None:
            return 0.0
        pred_n, gold_n = normalize_answer(pred), normalize_answer(gold)
        if pred_n == gold_n:
            return 1.0
        if not pred_n or len(pred_n) > MAX_ANSWER_CHARS or len(gold_n) > MAX_ANSWER_CHARS:
            return 0.0
        return 1.0 if _verify(gold_n, pred_n) else 0.0
    except Exception:  # noqa: BLE001 - never stop a rollout, but never pass a grading failure off as wrong
        log.warning("could not grade a response against gold %r", gold, exc_info=True)
        return math.nan


def count_grading_errors(rewards: list[float]) -> tuple[list[float], int]:
    """(rewards with every NaN, a response that could not be graded, scored 0.0; how many there were)."""
    errors = sum(1 for r in rewards if math.isnan(r))
    return [0.0 if math.isnan(r) else r for r in rewards], errors


def math_rewards(responses: list[str], golds: list[str]) -> list[float]:
    """`math_reward` per (response, gold) pair; the two lists must have the same length."""
    if len(responses) != len(golds):
        raise ValueError(f"math_rewards: {len(responses)} responses but {len(golds)} gold answers")
    return [math_reward(r, g) for r, g in zip(responses, golds, strict=True)]

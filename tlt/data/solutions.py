"""Step-by-step solutions for the arithmetic families (chain sums, products, basic arithmetic): one format.

One binary operation is applied per line, in precedence order (innermost group first, then * and / before + and
-, left to right), and each line restates the whole reduced expression:

    Add from left to right: 6+8-5+3.     ->   =14-5+3
                                              =9+3
                                              =12
                                              The answer is \\boxed{12}.

Every line is a true equation, so a model trained on them learns correct arithmetic. Most of each line is a copy of
the previous line's tail, which a tiny model learns quickly (a running-total format, "14-5=9", makes it find the
k-th term of the question instead, which it learned far more slowly), and copied text is what speculative
decoding drafts well, as in real reasoning traces. Expressions are written without spaces: each digit and
operator is one token, so a copy is token-aligned (under Qwen2's tokenizer rules a space before a digit is a token
of its own, and spaced expressions learned markedly slower). A problem with n terms takes n - 1 lines of
shrinking length, so response length grows quadratically with the number of terms: a difficulty mix with a few
long problems gives the long-tailed length distribution of reasoning RL. Solutions end with FINAL_LINE.
"""

from __future__ import annotations

from fractions import Fraction

FINAL_LINE = "The answer is \\boxed{{{answer}}}."

Token = int | str  # a number, or one of "+", "-", "*", "/", "(", "-(", ")"
_OPS = ("+", "-", "*", "/")


def final_line(answer: str) -> str:
    return FINAL_LINE.format(answer=answer)


def tokenize(expression: str) -> list[Token]:
    """Split a reasoning-gym expression ("3 * -( 4 + -5 ) / 2", spaces optional) into numbers and symbols."""
    tokens: list[Token] = []
    i, s = 0, expression.replace(" ", "")
    while i < len(s):
        c, prev = s[i], tokens[-1] if tokens else None
        unary = prev is None or prev in (*_OPS, "(", "-(")
        if c.isdigit() or (c == "-" and unary and i + 1 < len(s) and s[i + 1].isdigit()):
            j = i + 1
            while j < len(s) and s[j].isdigit():
                j += 1
            tokens.append(int(s[i:j]))
            i = j
        elif c == "-" and unary and s[i + 1 : i + 2] == "(":
            tokens.append("-(")
            i += 2
        elif c in (*_OPS, "(", ")"):
            tokens.append(c)
            i += 1
        else:
            raise ValueError(f"unexpected character {c!r} in expression {expression!r}")
    return tokens


def render(tokens: list[Token]) -> str:
    """Compact, without spaces ("14-5+3"): with digits split, every number digit and operator is one token."""
    return "".join(str(t) for t in tokens)


def compact(expression: str) -> str:
    """A reasoning-gym expression ("6 + 8 - -5") as our questions and solutions write it ("6+8--5")."""
    return render(tokenize(expression))


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction:
    if op == "/":
        if b == 0:
            raise ValueError("division by zero")
        return a / b
    return a + b if op == "+" else a - b if op == "-" else a * b


def _collapse_groups(tokens: list[Token]) -> list[Token]:
    """Replace each "( n )" / "-( n )" holding a single number by the number (a rewrite, not a step)."""
    out: list[Token] = []
    for t in tokens:
        out.append(t)
        if t == ")" and len(out) >= 3 and out[-3] in ("(", "-(") and isinstance(out[-2], int | Fraction):
            _, value, opener = out.pop(), out.pop(), out.pop()
            out.append(-value if opener == "-(" else value)
    return out


def _reduce_once(tokens: list[Token]) -> list[Token]:
    """Apply one binary operation: inside the innermost-leftmost group first, then * and / before + and -."""
    start, end = 0, len(tokens)
    if ")" in tokens:
        end = tokens.index(")")
        start = max(i for i in range(end) if tokens[i] in ("(", "-(")) + 1
    flat = tokens[start:end]
    ops = [i for i in range(1, len(flat), 2) if flat[i] in ("*", "/")] or list(range(1, len(flat), 2))
    k = start + ops[0]
    value = _apply(Fraction(tokens[k - 1]), str(tokens[k]), Fraction(tokens[k + 1]))
    return _collapse_groups([*tokens[: k - 1], value, *tokens[k + 2 :]])


def _as_int(value: Token) -> int:
    if not isinstance(value, int | Fraction) or Fraction(value).denominator != 1:
        raise ValueError(f"intermediate result {value} is not an integer")
    return int(value)


def arithmetic_steps(expression: str) -> tuple[list[str], int]:
    """One reduction per line ("=<reduced expression>"); raises ValueError if a division is not exact."""
    tokens, lines = _collapse_groups(tokenize(expression)), []
    while len(tokens) > 1:
        tokens = _reduce_once(tokens)
        tokens = [_as_int(t) if isinstance(t, Fraction) else t for t in tokens]
        lines.append("=" + render(tokens))
    return lines, _as_int(tokens[0])


def arithmetic_solution(expression: str) -> str:
    lines, value = arithmetic_steps(expression)
    return "\n".join([*lines, final_line(str(value))])


def cot_solution(cot: str, answer: str) -> str | None:
    """A GSM-style worked solution ("...\\n#### N") ending instead in the boxed answer; None if empty."""
    body = "\n".join(line for line in cot.strip().splitlines() if not line.startswith("####")).strip()
    return f"{body}\n{final_line(answer)}" if body else None

"""Step-by-step solution writers for the arithmetic families.

Every line is a true equation, so a model trained on them learns correct arithmetic, and the number of lines
grows with difficulty (more terms, more digits), which is what makes response lengths long-tailed. Lines are
short and regular because the tiny tokenizer splits digits one by one:
  chain sums:        one running-total line per term           "12 + 7 = 19" / "19 - 4 = 15"
  products:          long multiplication, one partial product per non-zero digit, then their running sum
  basic arithmetic:  one reduction per line in precedence order, each line "= <the reduced expression>"
All writers end with FINAL_LINE.
"""

from __future__ import annotations

from fractions import Fraction

FINAL_LINE = "The answer is \\boxed{{{answer}}}."

Token = int | str  # a number, or one of "+", "-", "*", "/", "(", "-(", ")"
_OPS = ("+", "-", "*", "/")


def final_line(answer: str) -> str:
    return FINAL_LINE.format(answer=answer)


def chain_sum_solution(terms: list[int], ops: list[str]) -> str:
    """Running total, one line per term: [12, 7, 4], ["+", "-"] -> "12 + 7 = 19\\n19 - 4 = 15\\n..."."""
    if len(ops) != len(terms) - 1 or any(op not in ("+", "-") for op in ops):
        raise ValueError(f"chain sum needs len(terms) - 1 operators from + and -, got {terms} {ops}")
    total, lines = terms[0], []
    for op, term in zip(ops, terms[1:], strict=True):
        new = total + term if op == "+" else total - term
        lines.append(f"{total} {op} {term} = {new}")
        total = new
    return "\n".join([*lines, final_line(str(total))])


def _times_lines(a: int, b: int) -> tuple[list[str], int]:
    """Long multiplication a * b: one partial product per non-zero digit of b, then their running sum."""
    if b == 0 or a == 0 or -10 < b < 10:
        return [f"{a} * {b} = {a * b}"], a * b
    sign = -1 if b < 0 else 1
    digits = str(abs(b))[::-1]
    parts = [sign * int(d) * 10**i for i, d in enumerate(digits) if d != "0"]
    lines = [f"{a} * {p} = {a * p}" for p in parts]
    total = a * parts[0]
    for p in parts[1:]:
        lines.append(f"{total} + {a * p} = {total + a * p}")
        total += a * p
    return lines, total


def products_solution(factors: list[int]) -> str:
    """Multiply left to right, each step by long multiplication."""
    if len(factors) < 2:
        raise ValueError(f"a product needs at least two factors, got {factors}")
    product, lines = factors[0], []
    for f in factors[1:]:
        step, product = _times_lines(product, f)
        lines.extend(step)
    return "\n".join([*lines, final_line(str(product))])


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
    return " ".join(str(t) for t in tokens)


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
    """One reduction per line ("= <reduced expression>"); raises ValueError if a division is not exact."""
    tokens, lines = _collapse_groups(tokenize(expression)), []
    while len(tokens) > 1:
        tokens = _reduce_once(tokens)
        tokens = [_as_int(t) if isinstance(t, Fraction) else t for t in tokens]
        lines.append("= " + render(tokens))
    return lines, _as_int(tokens[0])


def arithmetic_solution(expression: str) -> str:
    lines, value = arithmetic_steps(expression)
    return "\n".join([*lines, final_line(str(value))])


def cot_solution(cot: str, answer: str) -> str | None:
    """A GSM-style worked solution ("...\\n#### N") ending instead in the boxed answer; None if empty."""
    body = "\n".join(line for line in cot.strip().splitlines() if not line.startswith("####")).strip()
    return f"{body}\n{final_line(answer)}" if body else None

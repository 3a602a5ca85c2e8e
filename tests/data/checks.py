"""Independent checker of generated solutions: every line evaluated with Python's parser and Fractions."""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> Fraction:
    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        raise AssertionError(f"unexpected syntax in {expression!r}")

    return ev(ast.parse(expression, mode="eval").body)


def check_solution(solution: str, answer: str, question_expression: str | None = None) -> None:
    """Every line is a true equation, the chain of lines reaches `answer`, and the last line boxes it."""
    *lines, last = solution.split("\n")
    assert last == f"The answer is \\boxed{{{answer}}}.", last
    value = evaluate(question_expression) if question_expression else None
    for line in lines:
        if line.startswith("="):  # "=<expression>": equal to the previous line's value
            new = evaluate(line[1:])
            assert value is not None and new == value, (line, value)
        else:  # "A = B"
            left, right = line.split(" = ")
            assert evaluate(left) == evaluate(right), line
            new = evaluate(right)
        value = new
    assert value == Fraction(int(answer)), (value, answer)

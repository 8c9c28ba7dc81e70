"""Arithmetic problems: families with a difficulty knob, and a safe evaluator (the proposer–solver game's rules).

A problem is an integer expression over ``+``, ``-`` and ``*``. Its difficulty is a level: how large its
numbers may be (from 0–4 up to three digits) and how many operations join them
([`LEVELS`][multiagent_rl.envs.proposer_solver.problems.LEVELS]). [`evaluate`][multiagent_rl.envs.proposer_solver.problems.evaluate] computes an
expression's value by walking its syntax tree — never ``eval`` — and refuses anything that is not integer arithmetic.

```pycon
>>> import random
>>> problem, answer = make_problem("addition", 1, random.Random(0))
>>> evaluate(problem) == answer
True
>>> evaluate("12 * (3 - 5)")
-24
>>> evaluate("__import__('os')")
Traceback (most recent call last):
...
ValueError: not integer arithmetic: __import__('os')

```
"""

from __future__ import annotations

import ast
import random
from typing import NamedTuple


class Level(NamedTuple):
    """A difficulty level: numbers from ``low`` to ``high``, ``operations`` joining them."""

    low: int
    high: int
    operations: int


LEVELS: dict[int, Level] = {
    1: Level(0, 4, 1),  # 25 problems per operator: 3 + 4
    2: Level(0, 9, 1),  # 100: 7 + 8
    3: Level(0, 9, 2),  # 1,000: 7 + 8 + 2
    4: Level(10, 99, 1),  # 8,100: 37 + 45
    5: Level(10, 99, 2),
    6: Level(100, 999, 1),
}
"""Difficulty levels, easiest first (the knob: the numbers' size and the number of operations)."""

TOPICS: dict[str, tuple[str, ...]] = {
    "addition": ("+",),
    "subtraction": ("-",),
    "multiplication": ("*",),
    "mixed": ("+", "-", "*"),
}
"""Arithmetic families by the operators their problems use."""

_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
MAX_MAGNITUDE = 10**12
"""Intermediate values beyond this are refused (no exponential blow-up through repeated multiplication)."""


def make_problem(topic: str, level: int, rng: random.Random) -> tuple[str, int]:
    """A problem of ``topic`` at difficulty ``level`` and its answer, drawn from ``rng``."""
    if topic not in TOPICS:
        raise ValueError(f"unknown topic {topic!r}; topics: {', '.join(TOPICS)}")
    if level not in LEVELS:
        raise ValueError(f"unknown level {level}; levels: {sorted(LEVELS)}")
    low, high, operations = LEVELS[level]
    numbers = [rng.randint(low, high) for _ in range(operations + 1)]
    ops = [rng.choice(TOPICS[topic]) for _ in range(operations)]
    text = str(numbers[0]) + "".join(f" {op} {n}" for op, n in zip(ops, numbers[1:]))
    return text, evaluate(text)


def evaluate(expression: str) -> int:
    """The value of an integer expression over ``+ - *``, unary minus and parentheses; anything else is refused."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not integer arithmetic: {expression}") from None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            result = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            result = -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](value(node.left), value(node.right))
        else:
            raise ValueError(f"not integer arithmetic: {expression}")
        if abs(result) > MAX_MAGNITUDE:
            raise ValueError(f"a value in {expression!r} exceeds {MAX_MAGNITUDE:.0e}")
        return result

    return value(tree.body)


def level_of(expression: str) -> int | None:
    """The easiest level an expression fits (all its numbers in the level's range, the same operation count)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None
    numbers = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is int]
    operations = sum(isinstance(n, ast.BinOp) for n in ast.walk(tree))
    if not numbers:
        return None
    return next((level for level, (low, high, ops) in LEVELS.items()
                 if ops == operations and all(low <= abs(n) <= high for n in numbers)), None)

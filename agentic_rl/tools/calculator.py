"""Arithmetic for the model through a whitelisted AST evaluator (no `eval`)."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from agentic_rl.errors import ToolError
from agentic_rl.tools.base import Tool

__all__ = ["CalculatorTool", "evaluate_expression"]

MAX_EXPRESSION_CHARS = 256
MAX_RESULT_DIGITS = 400  # bound on any intermediate integer, in decimal digits
MAX_NODES = 128

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _log10(x: int | float) -> float:
    """log10 of |x| (Python's log10 is exact enough for huge ints); 0 for |x| < 1."""
    x = abs(x)
    return math.log10(x) if x >= 1 else 0.0


def _too_large() -> ToolError:
    return ToolError(f"result too large (more than {MAX_RESULT_DIGITS} digits)")


def _check_size(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    if isinstance(value, int) and value.bit_length() > 4 * MAX_RESULT_DIGITS:
        raise _too_large()  # > 1200 digits: no need to count exactly
    if isinstance(value, int) and len(str(abs(value))) > MAX_RESULT_DIGITS:
        raise _too_large()
    if isinstance(value, float) and _log10(value) >= MAX_RESULT_DIGITS:
        raise _too_large()
    return value


def _binary(op: ast.operator, left: int | float, right: int | float) -> int | float:
    # Refuse before computing what would clearly exceed the limit (a result of d digits has log10 >= d - 1).
    if isinstance(op, ast.Pow):
        if left == 0 and right < 0:
            raise ToolError("division by zero")
        if right > 0 and right * _log10(left) >= MAX_RESULT_DIGITS:
            raise _too_large()
    elif isinstance(op, ast.Mult) and _log10(left) + _log10(right) >= MAX_RESULT_DIGITS:
        raise _too_large()
    try:
        result = _BINARY[type(op)](left, right)
    except ZeroDivisionError as exc:
        raise ToolError("division by zero") from exc
    except (OverflowError, ValueError) as exc:
        raise ToolError(f"cannot compute: {exc}") from exc
    if isinstance(result, complex):
        raise ToolError("result is not a real number")
    return _check_size(result)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _binary(node.op, _eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ToolError(f"not allowed in an arithmetic expression: {type(node).__name__}")


def _format(value: int | float) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


def evaluate_expression(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, `+ - * / // % **`, `^` (power) and parentheses.

    Args:
        expression: at most 256 characters; `,` thousands separators and `$` signs are ignored.

    Returns:
        The value as text: integers exactly, other numbers to 10 significant digits.

    Raises:
        ToolError: for names, attributes, calls or any other syntax, a too long input or more than 128 syntax
            nodes, division by zero, or a result (or intermediate) of more than 400 digits. Powers and products
            are checked before computing, so `9**9**9**9` fails fast.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long ({len(expression)} characters, at most {MAX_EXPRESSION_CHARS})")
    cleaned = expression.replace(",", "").replace("$", "").replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(cleaned.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"not a valid arithmetic expression: {expression!r}") from exc
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"expression too complex (more than {MAX_NODES} syntax nodes)")
    return _format(_eval(tree))


class CalculatorTool(Tool):
    """Evaluates one arithmetic expression, e.g. `{"expression": "(16 - 3 - 4) * 2"}` -> `18`."""

    name = "calculator"
    description = "Evaluate an arithmetic expression with + - * / // % ** and parentheses; returns the number."
    parameters = {
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "The arithmetic expression, e.g. (16 - 3 - 4) * 2"}
        },
        "required": ["expression"],
    }
    timeout_s = 2.0

    def execute(self, arguments: dict[str, Any]) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolError('calculator needs {"expression": "<arithmetic>"}')
        return evaluate_expression(expression)

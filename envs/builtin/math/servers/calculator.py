"""A calculator MCP server: the math environment's tools.

Run it over stdio with ``python -m gymflow.envs.builtin.math.servers.calculator``; tests and the baseline policy
use the module-level ``server`` in memory (``mcp.Client(server)``).

Design decisions:

* Arithmetic is exact. Every argument is turned into a ``Fraction`` (a float through its shortest
  repr, so ``add(0.1, 0.2)`` is ``0.3``), and results come back as an int when integral, else a
  float. Only ``sqrt`` of a non-square and non-integral powers fall back to floats.
* Failures the model should read (division by zero, a bad expression, a result that is too large)
  raise ``ToolError``: mcp 2.x reports any other exception only as "Error executing tool NAME".
  Argument type errors never reach this code; the SDK's pydantic validation rejects them.
* ``evaluate`` walks a Python AST over a whitelist of nodes; there is no ``eval``, no names other
  than ``sqrt``, and sizes are bounded *before* computing, so ``9**9**9`` is refused at once.
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

Number = Fraction | float

MAX_EXPRESSION_CHARS = 1000
"""Longest expression `evaluate` accepts."""
MAX_EXPONENT = 10_000
"""Largest absolute exponent of a power."""
MAX_DIGITS = 300
"""Largest result, in decimal digits before the point (about the float range)."""

server = MCPServer(
    "calculator",
    instructions=(
        "An exact calculator. Use add, subtract, multiply, divide, power and sqrt for single steps, "
        "or evaluate for an expression of numbers with + - * / ** ( ) and sqrt(). "
        "Results are integers when exact, otherwise decimals."
    ),
)


def _exact(value: int | float) -> Number:
    """A number as an exact Fraction where possible (floats through their shortest repr)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError(f"{value} is not a finite number")
        return Fraction(repr(value))
    return Fraction(value)


def _log10(value: Number) -> float:
    """log10 |value| for a non-zero value, without converting huge Fractions to float."""
    if isinstance(value, Fraction):
        return math.log10(abs(value.numerator)) - math.log10(value.denominator)
    return math.log10(abs(value))


def _checked(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    if value != 0 and _log10(value) > MAX_DIGITS:
        raise ToolError(f"the result is too large (more than {MAX_DIGITS} digits)")
    return value


def _out(value: Number) -> int | float:
    """The wire form of a result: int when integral, else float."""
    value = _checked(value)
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else float(value)
    return int(value) if value.is_integer() else value


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("division by zero")
    return _checked(a / b)


def _power(base: Number, exponent: Number) -> Number:
    if not -MAX_EXPONENT <= exponent <= MAX_EXPONENT:
        raise ToolError(f"exponent too large (|exponent| must be at most {MAX_EXPONENT})")
    integral = exponent.denominator == 1 if isinstance(exponent, Fraction) else exponent.is_integer()
    if base < 0 and not integral:
        raise ToolError("a negative number to a fractional power is not a real number")
    if base == 0:
        if exponent < 0:
            raise ToolError("division by zero (zero to a negative power)")
        return Fraction(1) if exponent == 0 else Fraction(0)
    # Bound the size before computing, so 9**387420489 is refused instead of computed.
    magnitude = _log10(base) * float(exponent)
    if magnitude > MAX_DIGITS:
        raise ToolError(f"the result is too large (more than {MAX_DIGITS} digits)")
    if integral and isinstance(base, Fraction) and magnitude >= -MAX_DIGITS:
        return base ** int(exponent)
    # Inexact, or too small to matter: a float (possibly 0.0) instead of a huge denominator.
    return _checked(float(base) ** float(exponent))


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise ToolError("square root of a negative number")
    if isinstance(x, Fraction):
        num, den = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if num * num == x.numerator and den * den == x.denominator:
            return Fraction(num, den)
    return math.sqrt(x)


_BINARY = {
    ast.Add: lambda a, b: _checked(a + b),
    ast.Sub: lambda a, b: _checked(a - b),
    ast.Mult: lambda a, b: _checked(a * b),
    ast.Div: _divide,
    ast.Pow: _power,
}


def _eval_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return _exact(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt":
        if len(node.args) != 1 or node.keywords:
            raise ToolError("sqrt() takes exactly one argument")
        return _sqrt(_eval_node(node.args[0]))
    raise ToolError(f"unsupported syntax {ast.unparse(node)!r}: use numbers, + - * / ** ( ) and sqrt()")


def evaluate_expression(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely (the logic behind the `evaluate` tool).

    Args:
        expression: Numbers with ``+ - * / **`` (``^`` means ``**``), parentheses and ``sqrt()``.

    Returns:
        The value, an int when integral.

    Raises:
        ToolError: The expression is malformed, uses anything else, or its value is out of bounds.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long (at most {MAX_EXPRESSION_CHARS} characters)")
    try:
        tree = ast.parse(expression.replace("^", "**").strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"cannot parse expression {expression!r}") from exc
    try:
        return _out(_eval_node(tree))
    except RecursionError as exc:
        raise ToolError("expression nested too deeply") from exc


@server.tool()
def add(a: float, b: float) -> int | float:
    """Add two numbers: a + b.

    Args:
        a: First addend.
        b: Second addend.
    """
    return _out(_exact(a) + _exact(b))


@server.tool()
def subtract(a: float, b: float) -> int | float:
    """Subtract b from a: a - b.

    Args:
        a: Minuend.
        b: Subtrahend.
    """
    return _out(_exact(a) - _exact(b))


@server.tool()
def multiply(a: float, b: float) -> int | float:
    """Multiply two numbers: a * b.

    Args:
        a: First factor.
        b: Second factor.
    """
    return _out(_exact(a) * _exact(b))


@server.tool()
def divide(a: float, b: float) -> int | float:
    """Divide a by b: a / b. Fails on division by zero.

    Args:
        a: Dividend.
        b: Divisor (non-zero).
    """
    return _out(_divide(_exact(a), _exact(b)))


@server.tool()
def power(base: float, exponent: float) -> int | float:
    """Raise base to a power: base ** exponent.

    Args:
        base: The base.
        exponent: The exponent (|exponent| <= 10000; fractional only for a non-negative base).
    """
    return _out(_power(_exact(base), _exact(exponent)))


@server.tool()
def sqrt(x: float) -> int | float:
    """Square root of a non-negative number.

    Args:
        x: The radicand (>= 0).
    """
    return _out(_sqrt(_exact(x)))


@server.tool()
def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression, e.g. "(12 + 7) * 3 - sqrt(16) / 2".

    Args:
        expression: Numbers with + - * / ** (or ^), parentheses and sqrt(); nothing else.
    """
    return evaluate_expression(expression)


if __name__ == "__main__":
    server.run()

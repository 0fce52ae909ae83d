"""Numbers and math expressions: parse an answer as a number, compare within a tolerance, or
decide that two expressions denote the same value.

Design decisions:

* Numbers are parsed exactly (`fractions.Fraction`), so ``0.1 + 0.2``-style float error never
  decides a comparison; tolerances follow `math.isclose` (relative to the larger magnitude, or
  absolute), evaluated in exact arithmetic.
* Equivalence is numeric first, then symbolic with sympy for forms like ``2*sqrt(2)`` vs
  ``sqrt(8)`` or ``\\frac{1}{2}`` vs ``0.5``.
* Model text is untrusted and a reward must never hang. Sympy's ``parse_expr`` evals generated
  code, so the text is first restricted to a whitelist of characters and names (no attribute
  access, no dunder, no unknown functions); it is parsed unevaluated and its size bounded
  (length, exponents, digits) before sympy evaluates or simplifies anything.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import sympy
from sympy.parsing.sympy_parser import auto_number, auto_symbol, convert_xor, implicit_multiplication, parse_expr

MAX_SYMBOLIC_CHARS = 200
"""Longer answers are compared numerically only."""
MAX_MAGNITUDE_DIGITS = 1000.0
"""Symbolic expressions whose value may exceed 10**this are not evaluated."""

_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")
_EXPONENT_RE = re.compile(r"e([+-]?\d+)$", re.IGNORECASE)
_ALLOWED_CHARS_RE = re.compile(r"[0-9A-Za-z_ .+\-*/^(),]*")
_NAME_RE = re.compile(r"[A-Za-z_]\w*")

_FUNCTIONS: dict[str, Any] = {
    "sqrt": sympy.sqrt,
    "exp": sympy.exp,
    "log": sympy.log,
    "ln": sympy.log,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "abs": sympy.Abs,
    "pi": sympy.pi,
    "E": sympy.E,
    "oo": sympy.oo,
}
# What parse_expr's generated code refers to; nothing else is reachable from it.
_PARSER_GLOBALS: dict[str, Any] = {
    name: getattr(sympy, name) for name in ("Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow")
}
_TRANSFORMATIONS = (auto_symbol, auto_number, convert_xor, implicit_multiplication)
_LATEX = [
    (re.compile(r"\\left|\\right|\\[,!;: ]|\$"), ""),
    (re.compile(r"\\(?:cdot|times)"), "*"),
    (re.compile(r"\\div"), "/"),
    (re.compile(r"\\pi\b"), "pi"),
    (re.compile(r"\\(sqrt|exp|log|ln|sin|cos|tan)\b"), r"\1"),
    (re.compile(r"\\%|%"), "*(1/100)"),
]
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_ROOT_RE = re.compile(r"sqrt\s*\[([^\[\]]*)\]\s*\{([^{}]*)\}")
_SQRT_RE = re.compile(r"sqrt\s*\{([^{}]*)\}")


def parse_number(s: str) -> Fraction | float | None:
    """Parse a plain number: ``"1,234"``, ``"3/4"``, ``"-2.5"``, ``"50%"``, ``"1e3"``, ``"$12"``.

    Args:
        s: The text; surrounding spaces, a leading ``$`` and a trailing ``.`` are ignored. Units or
            words make it not a number.

    Returns:
        An exact Fraction, a float when the exponent is too large for an exact value, or None when
        `s` is not a finite number.
    """
    text = s.strip().replace("\u2212", "-").removeprefix("$").strip()
    percent = text.endswith("%")
    text = text.removesuffix("%").strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    if "," in text:
        if not _THOUSANDS_RE.fullmatch(text):
            return None
        text = text.replace(",", "")
    if not text or len(text) > 100 or any(c.isspace() for c in text):
        return None
    exponent = _EXPONENT_RE.search(text)
    try:
        if exponent and abs(int(exponent.group(1))) > 300:
            value: Fraction | float = float(text)  # an exact Fraction of 1e999999 would be huge
            if not math.isfinite(value):
                return None
        else:
            value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def _numbers_close(a: Fraction | float, b: Fraction | float, rel_tol: float, abs_tol: float) -> bool:
    # math.isclose's rule, in exact arithmetic: floats cannot hold every Fraction (1/3, 10**400).
    x, y = Fraction(a), Fraction(b)
    return abs(x - y) <= max(Fraction(rel_tol) * max(abs(x), abs(y)), Fraction(abs_tol))


def numeric_close(
    pred: str | float | Fraction, truth: str | float | Fraction, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """Whether two numbers agree within a tolerance (`math.isclose`'s rule, in exact arithmetic).

    Args:
        pred: The model's answer: a number, or text `parse_number` reads (``"1,234"``, ``"50%"``).
        truth: The ground truth, likewise.
        rel_tol: Allowed difference relative to the larger magnitude.
        abs_tol: Allowed absolute difference.

    Returns:
        True when both are finite numbers with ``|pred - truth| <= max(rel_tol * max(|pred|,
        |truth|), abs_tol)``; False when either is not a number (booleans are not numbers).

    Raises:
        ValueError: A tolerance is negative or not finite.
    """
    if not (math.isfinite(rel_tol) and math.isfinite(abs_tol)) or rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"tolerances must be finite and >= 0, got rel_tol={rel_tol!r}, abs_tol={abs_tol!r}")
    a, b = _as_number(pred), _as_number(truth)
    if a is None or b is None:
        return False
    return _numbers_close(a, b, rel_tol, abs_tol)


def _as_number(value: str | float | Fraction) -> Fraction | float | None:
    if isinstance(value, str):
        return parse_number(value)
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _delatex(text: str) -> str:
    for pattern, replacement in _LATEX:
        text = pattern.sub(replacement, text)
    while True:  # innermost braces first, so \frac{\sqrt{3}}{2} works
        new = _SQRT_RE.sub(r"sqrt(\1)", _ROOT_RE.sub(r"((\2)**(1/(\1)))", _FRAC_RE.sub(r"((\1)/(\2))", text)))
        if new == text:
            return new.replace("{", "(").replace("}", ")")
        text = new


def _magnitude(expr: sympy.Basic) -> float:
    """An upper bound on the decimal digits of any value inside `expr` (inf when unbounded)."""
    if isinstance(expr, sympy.Rational):  # Integer included
        return float(max(len(str(abs(expr.p))), len(str(expr.q))))
    if isinstance(expr, sympy.Float):
        value = abs(float(expr))
        return abs(math.log10(value)) + 1 if 0 < value < math.inf else (1.0 if expr == 0 else math.inf)
    if not expr.args:
        return 1.0
    parts = [_magnitude(a) for a in expr.args]
    if isinstance(expr, sympy.Pow):
        exponent = expr.args[1]
        if parts[1] > 4:
            return math.inf
        return parts[0] * max(1.0, abs(float(exponent)) if exponent.is_Number else 10 ** parts[1])
    if isinstance(expr, sympy.exp):
        return math.inf if parts[0] > 4 else 10 ** parts[0] / 2.3
    if isinstance(expr, sympy.Mul):
        return sum(parts)
    if isinstance(expr, sympy.Add):
        return max(parts) + 1
    return sum(parts) + 1


def _to_sympy(text: str) -> sympy.Basic | None:
    """Parse an answer into a bounded sympy expression, or None if it is not safely parseable."""
    text = _delatex(text.strip())
    if len(text) > MAX_SYMBOLIC_CHARS or "\\" in text or not _ALLOWED_CHARS_RE.fullmatch(text):
        return None
    local: dict[str, Any] = {}
    for name in _NAME_RE.findall(text):
        if name in _FUNCTIONS:
            local[name] = _FUNCTIONS[name]
        elif len(name) == 1:
            local[name] = sympy.Symbol(name)
        else:
            return None
    try:
        # Unevaluated first: nothing is computed until the size bound below has passed.
        raw = parse_expr(
            text, local_dict=local, global_dict=dict(_PARSER_GLOBALS), transformations=_TRANSFORMATIONS, evaluate=False
        )
        if not isinstance(raw, sympy.Basic) or _magnitude(raw) > MAX_MAGNITUDE_DIGITS:
            return None
        return sympy.sympify(raw.doit())
    except Exception:  # untrusted text: any parse or evaluation failure means "not comparable"
        return None


def math_equivalent(pred: str, truth: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether two answers denote the same value.

    Args:
        pred: The model's answer.
        truth: The ground truth.
        rel_tol: Relative tolerance for numeric comparison.
        abs_tol: Absolute tolerance for numeric comparison.

    Returns:
        True when both parse as numbers within tolerance, or sympy shows them equal (exactly, or
        numerically within tolerance for constant expressions).
    """
    pred, truth = pred.strip(), truth.strip()
    if not pred or not truth:
        return False
    if pred == truth:
        return True
    a, b = parse_number(pred), parse_number(truth)
    if a is not None and b is not None:
        return _numbers_close(a, b, rel_tol, abs_tol)
    ea, eb = _to_sympy(pred), _to_sympy(truth)
    if ea is None or eb is None:
        return False
    try:
        if not ea.free_symbols and not eb.free_symbols:
            va, vb = sympy.N(ea, 30), sympy.N(eb, 30)
            if not (va.is_finite and vb.is_finite):  # oo, zoo (1/0), nan: only identical forms match
                return bool(ea == eb)
            scale = sympy.Max(abs(va), abs(vb))
            return bool(abs(va - vb) <= sympy.Max(rel_tol * scale, abs_tol))
        return bool(sympy.simplify(ea - eb) == 0)
    except Exception:  # sympy failing on odd input is a wrong answer, not a crashed reward
        return False

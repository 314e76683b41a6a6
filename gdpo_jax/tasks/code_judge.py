"""The code task's judges: a program's stdout against the expected (token by token,
as competitive-programming judges compare) and a return value against the expected
(by value, after JSON). Pure functions of text and values: no sandbox here.
"""

from __future__ import annotations

import decimal
import fractions
import math
import re
from typing import Any

_INT = re.compile(r"[+-]?[0-9]+")
# A decimal number as a judge reads one: ASCII digits only. float() also takes "1_000",
# non-ASCII digits ("١٢") and "infinity", which a judge would not equate with 1000 or 12.
# The optional dot is grouped with its fraction: "[0-9]+\.?[0-9]*" split a digit run
# between its two stars in every way, quadratic in a token's length (a program printing
# 65,000 digits and an "x" held a reward thread, GIL and all, for 95 s).
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _int_digits(t: str) -> tuple[bool, str]:
    """An integer token as (negative, digits without leading zeros): int() refuses more
    than 4300 digits, which a program may well print."""
    digits = t.lstrip("+-").lstrip("0") or "0"
    return t.startswith("-") and digits != "0", digits


def _tokens_equal(a: str, b: str, tol: float) -> bool:
    if a == b:
        return True
    if _INT.fullmatch(a) and _INT.fullmatch(b):
        # Two integers compare exactly, as the return-value judge does: within tol,
        # 1000001 passed for 1000000 (and above 2**53 float() made any two equal).
        return _int_digits(a) == _int_digits(b)
    if not (_FLOAT.fullmatch(a) and _FLOAT.fullmatch(b)):
        return False
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isinf(x) or math.isinf(y):
        # Past float's range both were inf, and "1e999" passed for a 400-digit integer
        # (as any two such tokens did): compare the decimal values themselves.
        try:
            return _close(decimal.Decimal(a), decimal.Decimal(b), decimal.Decimal(tol))
        except ArithmeticError:  # an exponent past Decimal's range: not comparable
            return False
    return math.isclose(x, y, rel_tol=tol, abs_tol=tol)


def _close(x: Any, y: Any, tol: Any) -> bool:
    """math.isclose(x, y, rel_tol=tol, abs_tol=tol) for exact types (Decimal, Fraction)."""
    return abs(x - y) <= max(tol * max(abs(x), abs(y)), tol)


def stdout_matches(actual: str, expected: str, tol: float = 1e-6) -> bool:
    """Judge-style comparison: per line, whitespace-separated tokens equal
    (integers exactly, other numbers within `tol`), trailing spaces and blank lines
    ignored."""
    a = [ln.split() for ln in actual.strip().splitlines()]
    e = [ln.split() for ln in expected.strip().splitlines()]
    a = [t for t in a if t]
    e = [t for t in e if t]
    if len(a) != len(e):
        return False
    return all(
        len(x) == len(y) and all(_tokens_equal(p, q, tol) for p, q in zip(x, y))
        for x, y in zip(a, e)
    )


def value_matches(value: Any, expected: Any, tol: float = 1e-6) -> bool:
    """Return-value comparison (APPS convention: an expected value may be
    wrapped in a one-element list; tuples are lists after JSON; numbers
    within `tol` when either is a float, integers exactly; booleans only equal
    booleans)."""

    def eq(a, b):
        if isinstance(a, bool) or isinstance(b, bool):  # True is not 1 here
            return type(a) is type(b) and a == b
        if isinstance(a, int) and isinstance(b, int):  # 1000001 is not 1000000
            return a == b
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            try:
                return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
            except OverflowError:  # an int past float's range (10**400): the
                # trainer stopped on the OverflowError; an int is finite, so it
                # never equals inf or NaN, and compares exactly otherwise
                if not all(math.isfinite(v) for v in (a, b) if isinstance(v, float)):
                    return False
                return _close(fractions.Fraction(a), fractions.Fraction(b), fractions.Fraction(tol))
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)
        return a == b

    if eq(value, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and eq(value, expected[0])

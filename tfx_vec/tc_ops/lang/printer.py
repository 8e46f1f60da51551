"""Print TC expressions back as TC text (for messages and canonical keys).

Example:
    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> s = parse("def f(float(N) A) -> (B) { B(i) = A(i + 1) * -2 }").defs[0].stmts[0]
    >>> expr_to_tc(s.rhs)
    'A(i + 1) * -2'
"""
from __future__ import annotations

from typing import Callable

from . import ast as A

__all__ = ["expr_to_tc"]

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "+": 5, "-": 5,
         "*": 6, "/": 6, "%": 6}


def expr_to_tc(e: A.Expr, parent: int = 0, *, rename: Callable[[str], str] | None = None,
               full: bool = False) -> str:
    """TC text of ``e`` with the parentheses its precedence needs.

    ``rename`` maps tensor names (calls and ``T.dim`` references).  ``full`` parenthesises
    every binary and conditional operation and every unary operand: the form
    :mod:`tfx_vec.tc_ops.grad` splices into its symbolic sums and products as text.

    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> s = parse("def f(float(N) A) -> (B) { B(i) = A(i + 1) * -2 }").defs[0].stmts[0]
    >>> expr_to_tc(s.rhs, rename=str.lower, full=True)
    '(a((i + 1)) * -(2))'
    """
    def sub(x: A.Expr, p: int = 0) -> str:
        return expr_to_tc(x, p, rename=rename, full=full)
    name = rename or (lambda n: n)
    if isinstance(e, A.IntLit):
        return str(e.value)
    if isinstance(e, A.FloatLit):
        return e.text
    if isinstance(e, A.Ident):
        return e.name
    if isinstance(e, A.DimRef):
        return f"{name(e.name)}.{e.dim}"
    if isinstance(e, A.Call):
        return f"{name(e.name)}({(',' if full else ', ').join(sub(a) for a in e.args)})"
    if isinstance(e, A.Unary):
        return f"{e.op}({sub(e.operand)})" if full else e.op + sub(e.operand, 7)
    if isinstance(e, A.Binary):
        p = _PREC[e.op]
        if full:
            return f"({sub(e.lhs)} {e.op} {sub(e.rhs)})"
        text = f"{sub(e.lhs, p)} {e.op} {sub(e.rhs, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, A.Ternary):
        text = f"{sub(e.cond, 1)} ? {sub(e.then)} : {sub(e.other)}"
        return f"({text})" if parent or full else text
    raise TypeError(e)  # pragma: no cover

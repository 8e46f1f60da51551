"""Print TC expressions back as TC text (for messages and canonical keys).

Example:
    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> s = parse("def f(float(N) A) -> (B) { B(i) = A(i + 1) * -2 }").defs[0].stmts[0]
    >>> expr_to_tc(s.rhs)
    'A(i + 1) * -2'
"""
from __future__ import annotations

from . import ast as A

__all__ = ["expr_to_tc"]

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "+": 5, "-": 5,
         "*": 6, "/": 6, "%": 6}


def expr_to_tc(e: A.Expr, parent: int = 0) -> str:
    """TC text of ``e`` with the parentheses its precedence needs."""
    if isinstance(e, A.IntLit):
        return str(e.value)
    if isinstance(e, A.FloatLit):
        return e.text
    if isinstance(e, A.Ident):
        return e.name
    if isinstance(e, A.DimRef):
        return f"{e.name}.{e.dim}"
    if isinstance(e, A.Call):
        return f"{e.name}({', '.join(expr_to_tc(a) for a in e.args)})"
    if isinstance(e, A.Unary):
        return e.op + expr_to_tc(e.operand, 7)
    if isinstance(e, A.Binary):
        p = _PREC[e.op]
        text = f"{expr_to_tc(e.lhs, p)} {e.op} {expr_to_tc(e.rhs, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, A.Ternary):
        text = f"{expr_to_tc(e.cond, 1)} ? {expr_to_tc(e.then)} : {expr_to_tc(e.other)}"
        return f"({text})" if parent else text
    raise TypeError(e)  # pragma: no cover

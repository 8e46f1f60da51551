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

__all__ = ["expr_to_tc", "param_to_tc", "stmt_to_tc", "def_to_tc"]

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


def param_to_tc(p: A.Param) -> str:
    """``float(M,K) A`` / ``int32 n``.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> param_to_tc(parse("def f(float(M, 4) A) -> (B) { B(i) = A(i, 0) }").defs[0].params[0])
        'float(M,4) A'
    """
    if p.is_scalar:
        return f"{p.dtype} {p.name}"
    return f"{p.dtype}({','.join(str(x) for x in p.dims)}) {p.name}"


def stmt_to_tc(s: A.Stmt) -> str:
    """One statement as TC text (``where`` ranges and ``exists`` clauses included).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> d = parse("def f(float(N) A) -> (B) { B(i) = A(i - 1) where i in 1:N }").defs[0]
        >>> s = d.stmts[0]
        >>> stmt_to_tc(s)
        'B(i) = A(i - 1) where i in 1:N'
    """
    lhs = f"{s.lhs}({','.join(s.lhs_indices)})" if s.lhs_indices else s.lhs
    where = [f"{w.var} in {expr_to_tc(w.lo)}:{expr_to_tc(w.hi)}" for w in s.where]
    where += [f"exists {expr_to_tc(e)}" for e in s.exists]
    return (f"{lhs} {s.op}{'!' if s.init else ''} {expr_to_tc(s.rhs)}"
            + (f" where {', '.join(where)}" if where else ""))


def def_to_tc(d: A.Def, *, extra_params: tuple = (), prologue: tuple = ()) -> str:
    """A whole ``def`` as TC text, which parses back to the same definition.

    ``extra_params`` (text) are appended to the signature and ``prologue`` statements (text)
    put before the def's own (as :mod:`tfx_vec.tc_ops.pipeline` does for initial outputs).

    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> print(def_to_tc(parse("def f(float(N) A) -> (int32(N) B) { B(i) = int32(A(i)) }").defs[0]))
    def f(float(N) A) -> (int32(N) B) {
        B(i) = int32(A(i))
    }
    """
    params = [param_to_tc(p) for p in d.params] + list(extra_params)
    rets = [param_to_tc(t) if t is not None else r
            for r, t in zip(d.returns, d.return_types or (None,) * len(d.returns))]
    body = list(prologue) + [stmt_to_tc(s) for s in d.stmts]
    return (f"def {d.name}({', '.join(params)}) -> ({', '.join(rets)}) {{\n"
            + "".join(f"    {line}\n" for line in body) + "}")

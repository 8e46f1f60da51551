"""Which reduction statements are contractions a CPU micro-kernel can compute.

A *contraction* is a ``+=`` reduction (``!`` or not) over floats whose right side is a product of
factors that split between two of its left-hand indices: *row* factors move with ``v1`` (and the
reduction indices) but not ``v2``, *column* factors move with ``v2`` but not ``v1`` (tmm's
``C(m,n) +=! A(m,kk) * B(n,kk)``: ``A`` is the row operand, ``B`` the column operand).  Factors
moving with neither (scalars, weights of an outer index) go with the row operand.  The printer
(``codegen/contraction.py``) keeps a ``rows x columns`` block of sums in vector registers: per
reduction step one vector load per column vector, one broadcast per row, one FMA per pair.

The column operand is either read *directly* (one tensor read whose last subscript is ``v2 +
c`` and whose other subscripts do not use ``v2``: contiguous vectors, conv's ``I(..., w + kw)``),
or *packed*: its values over a block of columns and reduction steps are copied into a local
buffer first (tmm's ``B(n, kk)``, contiguous along the reduction; packing needs a single
reduction index).

Example:
    >>> from tfx_vec.tc_ops.lang.sema import check_program
    >>> d = check_program("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                   "{ C(m,n) +=! A(m,kk) * B(n,kk) }")["tmm"]
    >>> c = classify(d, d.stmts[0], "m", "n")
    >>> [str(f.name) for f in c.row], [str(f.name) for f in c.col], c.direct, c.packable
    (['A'], ['B'], False, True)
"""
from __future__ import annotations

import dataclasses

from ..lang import ast as A
from ..lang.sema import CheckedDef, CheckedStmt, linear_in

__all__ = ["Split", "factors", "classify", "contiguous", "has_contraction"]


@dataclasses.dataclass(frozen=True)
class Split:
    """A contraction's right side split into row and column factors (see module docstring).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> d = check_program("def mv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }")
        >>> classify(d["mv"], d["mv"].stmts[0], "m", "k") is None   # k is reduced, not a column
        True
    """

    row: tuple[A.Expr, ...]
    col: tuple[A.Expr, ...]
    direct: bool        # every column factor is a contiguous read along v2
    packable: bool      # a single reduction index: the column values can be packed


def factors(e: A.Expr) -> list[A.Expr]:
    """The operands of a tree of ``*`` (``a * (b * c)`` -> ``[a, b, c]``).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> from tfx_vec.tc_ops.lang.printer import expr_to_tc
        >>> [expr_to_tc(f) for f in factors(parse_expr("a * (b * c)"))]
        ['a', 'b', 'c']
    """
    if isinstance(e, A.Binary) and e.op == "*":
        return factors(e.lhs) + factors(e.rhs)
    return [e]


def _uses(e: A.Expr, var: str) -> bool:
    return any(isinstance(x, A.Ident) and x.name == var for x in A.walk(e))


def contiguous(cdef: CheckedDef, e: A.Expr, var2: str, dtype: str) -> bool:
    """Is ``e`` a read of a ``dtype`` tensor whose last subscript is ``var2 + <no var2>`` and
    whose other subscripts do not use ``var2``?

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> [contiguous(d, parse_expr(e), "n", "float") for e in ("B(k, n)", "B(n, k)")]
        [True, False]
    """
    if not (isinstance(e, A.Call) and e.name in cdef.tensors and e.args):
        return False
    if cdef.tensors[e.name].dtype != dtype or any(_uses(a, var2) for a in e.args[:-1]):
        return False
    if any(isinstance(x, A.Call) for a in e.args for x in A.walk(a)):
        return False        # data-dependent subscripts are clamped: not a plain address
    lin = linear_in(e.args[-1], var2, cdef.params)
    return lin is not None and _is_one(lin[0])


def _is_one(e: A.Expr) -> bool:
    """``1`` possibly wrapped in the ``1 + 0`` / ``0 + 1`` sums :func:`linear_in` builds."""
    if isinstance(e, A.IntLit):
        return e.value == 1
    if isinstance(e, A.Binary) and e.op == "+":
        return (_is_one(e.lhs) and _is_zero(e.rhs)) or (_is_zero(e.lhs) and _is_one(e.rhs))
    if isinstance(e, A.Binary) and e.op == "-":
        return _is_one(e.lhs) and _is_zero(e.rhs)
    return False


def _is_zero(e: A.Expr) -> bool:
    if isinstance(e, A.IntLit):
        return e.value == 0
    if isinstance(e, A.Binary) and e.op in "+-":
        return _is_zero(e.lhs) and _is_zero(e.rhs)
    if isinstance(e, A.Binary) and e.op == "*":
        return _is_zero(e.lhs) or _is_zero(e.rhs)
    return False


def classify(cdef: CheckedDef, cs: CheckedStmt, var1: str, var2: str,
             vectors: bool = True) -> Split | None:
    """The row/column split of statement ``cs`` with rows along ``var1`` and columns along
    ``var2`` (two of its left-hand indices), or None when it is not such a contraction.
    ``vectors``: the columns are vector lanes, so they must be read contiguously or packed
    (GPU register tiles, scalar per thread, do not need that).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> s = classify(d, d.stmts[0], "m", "n")
        >>> s.direct, s.packable      # B(k, n) is contiguous along the columns n
        (True, True)
    """
    s = cs.stmt
    if s.op != "+=" or cs.dtype not in ("float", "double") or var1 == var2:
        return None
    if var1 not in cs.lhs_vars or var2 not in cs.lhs_vars or not cs.red_vars:
        return None
    if any(isinstance(x, A.Call) and x.name == s.lhs for x in A.walk(s.rhs)):
        return None
    row, col = [], []
    for f in factors(s.rhs):
        u1, u2 = _uses(f, var1), _uses(f, var2)
        if u1 and u2:
            return None
        (col if u2 else row).append(f)
    if not col:
        return None
    direct = all(contiguous(cdef, f, var2, cs.dtype) for f in col)
    packable = len(cs.red_vars) == 1
    if vectors and not (direct or packable):
        return None
    return Split(tuple(row), tuple(col), direct, packable)


def has_contraction(cdef: CheckedDef) -> bool:
    """Does some statement of ``cdef`` split as a contraction along some pair of its indices?
    (The CPU schedule then leaves its band untiled for the micro-kernel, which blocks it.)

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> defs = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                      "{ C(m,n) +=! A(m,k) * B(k,n) } "
        ...                      "def relu(float(N) A) -> (B) { B(i) = fmax(A(i), 0) }")
        >>> has_contraction(defs["mm"]), has_contraction(defs["relu"])
        (True, False)
    """
    for cs in cdef.stmts:
        lhs = cs.lhs_vars
        if any(classify(cdef, cs, a, b) for a in lhs for b in lhs if a != b):
            return True
    return False

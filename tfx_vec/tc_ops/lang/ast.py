"""The TC abstract syntax tree: frozen dataclasses, every node keeps its source :class:`Span`.

``Call`` covers the three ``id(args)`` forms of the grammar (tensor access, builtin call, cast);
semantic analysis (``lang.sema``) tells them apart.

Example:
    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> prog = parse("def f(float(N) A) -> (B) { B(i) = A(i) * 2 }")
    >>> prog.defs[0].stmts[0].lhs_indices
    ('i',)
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Union

from ..errors import Span

__all__ = ["Expr", "IntLit", "FloatLit", "Ident", "Call", "Unary", "Binary", "Ternary", "DimRef",
           "RangeConstraint", "Stmt", "Param", "Def", "Program", "walk", "map_idents", "map_calls",
           "start_span",
           "REDUCTION_OPS"]

# assignment operators: "=" plus the reductions, with or without the initialising "!"
REDUCTION_OPS = ("+=", "*=", "min=", "max=")


@dataclasses.dataclass(frozen=True)
class IntLit:
    """An integer literal.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> parse_expr("7").value
        7
    """
    value: int
    span: Span


@dataclasses.dataclass(frozen=True)
class FloatLit:
    """A floating-point literal; ``text`` keeps the spelling (a trailing ``f`` makes it float).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> lit = parse_expr("1.5f")
        >>> lit.value, lit.text
        (1.5, '1.5f')
    """
    value: float
    text: str          # as written, e.g. "1.5f" (a trailing f/F makes it float, else double)
    span: Span


@dataclasses.dataclass(frozen=True)
class Ident:
    """A name: an index variable, a scalar parameter, a size or a rank-0 tensor.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> parse_expr("N").name
        'N'
    """
    name: str
    span: Span


@dataclasses.dataclass(frozen=True)
class Call:
    """``name(args)``: a tensor access, a builtin call or a cast (resolved by sema).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> c = parse_expr("A(i, j + 1)")
        >>> c.name, len(c.args)
        ('A', 2)
    """

    name: str
    args: tuple["Expr", ...]
    span: Span


@dataclasses.dataclass(frozen=True)
class Unary:
    """A prefix operator (``-``, ``!``) applied to ``operand``.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> parse_expr("-x").op
        '-'
    """
    op: str            # "-", "!" or "+"
    operand: "Expr"
    span: Span


@dataclasses.dataclass(frozen=True)
class Binary:
    """A binary operator; ``span`` is the operator's.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> e = parse_expr("a * b + c")
        >>> e.op, e.lhs.op
        ('+', '*')
    """
    op: str            # + - * / % == != < <= > >= && ||
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@dataclasses.dataclass(frozen=True)
class Ternary:
    """``cond ? then : other``; the branch not taken is not evaluated (reads in it are guarded).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> e = parse_expr("i > 0 ? A(i - 1) : 0")
        >>> e.then.name
        'A'
    """
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    span: Span


@dataclasses.dataclass(frozen=True)
class DimRef:
    """``name.k``: the size of dimension ``k`` of tensor ``name``.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> e = parse_expr("A.1")
        >>> e.name, e.dim
        ('A', 1)
    """

    name: str
    dim: int
    span: Span


Expr = Union[IntLit, FloatLit, Ident, Call, Unary, Binary, Ternary, DimRef]
Expr.__doc__ = """Any expression node: a literal, a name, a call, an operator or a size ``A.k``.

Example:
    >>> from tfx_vec.tc_ops.lang.parser import parse_expr
    >>> isinstance(parse_expr("A(i) + 1"), Binary)
    True
"""


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, Ternary):
        return (e.cond, e.then, e.other)
    return ()


def start_span(e: Expr) -> Span:
    """The span of the leftmost token of ``e`` (binary nodes keep their operator's span).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> start_span(parse_expr("a + b")).column
        1
    """
    while isinstance(e, (Binary, Ternary)):
        e = e.lhs if isinstance(e, Binary) else e.cond
    return e.span


def map_idents(e: Expr, fn: Callable[[Ident], Expr]) -> Expr:
    """``e`` with every identifier ``x`` replaced by ``fn(x)`` (a new tree; shared subtrees
    are rebuilt, so node identities stay unique per occurrence).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> from tfx_vec.tc_ops.lang.printer import expr_to_tc
        >>> expr_to_tc(map_idents(parse_expr("A(i) + i"), lambda x: Ident("j", x.span)))
        'A(j) + j'
    """
    if isinstance(e, Ident):
        return fn(e)
    if isinstance(e, Call):
        return Call(e.name, tuple(map_idents(a, fn) for a in e.args), e.span)
    if isinstance(e, Unary):
        return Unary(e.op, map_idents(e.operand, fn), e.span)
    if isinstance(e, Binary):
        return Binary(e.op, map_idents(e.lhs, fn), map_idents(e.rhs, fn), e.span)
    if isinstance(e, Ternary):
        return Ternary(map_idents(e.cond, fn), map_idents(e.then, fn), map_idents(e.other, fn),
                       e.span)
    return e


def map_calls(e: Expr, fn: Callable[[Call], Expr]) -> Expr:
    """``e`` with every call ``c`` (arguments rewritten first) replaced by ``fn(c)``.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> from tfx_vec.tc_ops.lang.printer import expr_to_tc
        >>> expr_to_tc(map_calls(parse_expr("exp(A(i))"),
        ...                      lambda c: Call("B", c.args, c.span) if c.name == "A" else c))
        'exp(B(i))'
    """
    if isinstance(e, Call):
        return fn(Call(e.name, tuple(map_calls(a, fn) for a in e.args), e.span))
    if isinstance(e, Unary):
        return Unary(e.op, map_calls(e.operand, fn), e.span)
    if isinstance(e, Binary):
        return Binary(e.op, map_calls(e.lhs, fn), map_calls(e.rhs, fn), e.span)
    if isinstance(e, Ternary):
        return Ternary(map_calls(e.cond, fn), map_calls(e.then, fn), map_calls(e.other, fn),
                       e.span)
    return e


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order traversal of an expression.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> [type(n).__name__ for n in walk(parse_expr("A(i) + 1"))]
        ['Binary', 'Call', 'Ident', 'IntLit']
    """
    yield e
    for c in children(e):
        yield from walk(c)


@dataclasses.dataclass(frozen=True)
class RangeConstraint:
    """``var in lo:hi`` of a where clause (half-open: lo <= var < hi).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> s = parse("def f(float(N) A) -> (B) { B(i) = A(i) where i in 1:N }").defs[0].stmts[0]
        >>> s.where[0].var
        'i'
    """

    var: str
    lo: Expr
    hi: Expr
    span: Span


@dataclasses.dataclass(frozen=True)
class Stmt:
    """One statement ``lhs(indices) op rhs where ...`` (``op`` is ``=`` or a reduction; ``init``
    is True for the ``!`` forms that start from the reduction's neutral element).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> s = parse("def f(float(N,K) A) -> (B) { B(n) +=! A(n,k) }").defs[0].stmts[0]
        >>> s.lhs, s.lhs_indices, s.op, s.init
        ('B', ('n',), '+=', True)
    """
    lhs: str
    lhs_indices: tuple[str, ...]
    lhs_index_spans: tuple[Span, ...]
    op: str                     # "=" or one of REDUCTION_OPS
    init: bool                  # the "!" form: initialise with the reduction's neutral element
    rhs: Expr
    where: tuple[RangeConstraint, ...]
    span: Span
    # ``where exists e``: expressions whose accesses only bound the ranges (never evaluated)
    exists: tuple["Expr", ...] = ()

    def index_vars(self) -> tuple[str, ...]:
        """LHS indices, then the other index-like identifiers of the RHS in order of appearance.

        (Before sema this is syntactic: any identifier that is not a call name.)
        """
        seen = list(self.lhs_indices)
        for root in (self.rhs, *self.exists):
            for e in walk(root):
                if isinstance(e, Ident) and e.name not in seen:
                    seen.append(e.name)
        return tuple(seen)


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter ``type name`` or ``type(D1, D2) name``; ``dims`` is None for a scalar.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> p = parse("def f(float(N, 3) A, int32 k) -> (B) { B(i) = A(i, k) }").defs[0].params
        >>> (p[0].dtype, p[0].dims), (p[1].dtype, p[1].dims)
        (('float', ('N', 3)), ('int32', None))
    """

    dtype: str
    dims: tuple[str | int, ...] | None
    name: str
    span: Span
    dim_spans: tuple[Span, ...] = ()

    @property
    def is_scalar(self) -> bool:
        return self.dims is None


@dataclasses.dataclass(frozen=True)
class Def:
    """One ``def name(params) -> (outputs) { statements }``; ``return_types`` holds the declared
    type of each output (``-> (int32(M) O)``), None where the output is untyped.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> d = parse("def f(float(N) A) -> (double(N) B, C) { B(i) = A(i)  C(i) = A(i) }").defs[0]
        >>> d.name, d.returns, d.return_types[0].dtype, d.return_types[1]
        ('f', ('B', 'C'), 'double', None)
    """
    name: str
    params: tuple[Param, ...]
    returns: tuple[str, ...]
    return_spans: tuple[Span, ...]
    stmts: tuple[Stmt, ...]
    span: Span
    # per output: its declared type ``-> (int32(M,N) O)`` as a Param, or None (inferred)
    return_types: tuple[Param | None, ...] = ()

    def return_type(self, name: str) -> Param | None:
        for r, t in zip(self.returns, self.return_types):
            if r == name:
                return t
        return None


@dataclasses.dataclass(frozen=True)
class Program:
    """A parsed TC source: its definitions in order, and the text (for error carets).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> [d.name for d in parse("def f(float(N) A) -> (B) { B(i) = A(i) }").defs]
        ['f']
    """
    defs: tuple[Def, ...]
    source: str

    def get(self, name: str) -> Def | None:
        for d in self.defs:
            if d.name == name:
                return d
        return None

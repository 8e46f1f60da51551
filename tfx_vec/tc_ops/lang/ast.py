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
           "RangeConstraint", "Stmt", "Param", "Def", "Program", "walk", "map_idents", "map_calls", "start_span",
           "REDUCTION_OPS"]

# assignment operators: "=" plus the reductions, with or without the initialising "!"
REDUCTION_OPS = ("+=", "*=", "min=", "max=")


@dataclasses.dataclass(frozen=True)
class IntLit:
    value: int
    span: Span


@dataclasses.dataclass(frozen=True)
class FloatLit:
    value: float
    text: str          # as written, e.g. "1.5f" (a trailing f/F makes it float, else double)
    span: Span


@dataclasses.dataclass(frozen=True)
class Ident:
    name: str
    span: Span


@dataclasses.dataclass(frozen=True)
class Call:
    """``name(args)``: a tensor access, a builtin call or a cast (resolved by sema)."""

    name: str
    args: tuple["Expr", ...]
    span: Span


@dataclasses.dataclass(frozen=True)
class Unary:
    op: str            # "-", "!" or "+"
    operand: "Expr"
    span: Span


@dataclasses.dataclass(frozen=True)
class Binary:
    op: str            # + - * / % == != < <= > >= && ||
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@dataclasses.dataclass(frozen=True)
class Ternary:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    span: Span


@dataclasses.dataclass(frozen=True)
class DimRef:
    """``name.k``: the size of dimension ``k`` of tensor ``name``."""

    name: str
    dim: int
    span: Span


Expr = Union[IntLit, FloatLit, Ident, Call, Unary, Binary, Ternary, DimRef]


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
    """The span of the leftmost token of ``e`` (binary nodes keep their operator's span)."""
    while isinstance(e, (Binary, Ternary)):
        e = e.lhs if isinstance(e, Binary) else e.cond
    return e.span


def map_idents(e: Expr, fn: Callable[[Ident], Expr]) -> Expr:
    """``e`` with every identifier ``x`` replaced by ``fn(x)`` (a new tree; shared subtrees
    are rebuilt, so node identities stay unique per occurrence)."""
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
    """``e`` with every call ``c`` (arguments rewritten first) replaced by ``fn(c)``."""
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
    """Pre-order traversal of an expression."""
    yield e
    for c in children(e):
        yield from walk(c)


@dataclasses.dataclass(frozen=True)
class RangeConstraint:
    """``var in lo:hi`` of a where clause (half-open: lo <= var < hi)."""

    var: str
    lo: Expr
    hi: Expr
    span: Span


@dataclasses.dataclass(frozen=True)
class Stmt:
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
    """A parameter ``type name`` or ``type(D1, D2) name``; ``dims`` is None for a scalar."""

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
    defs: tuple[Def, ...]
    source: str

    def get(self, name: str) -> Def | None:
        for d in self.defs:
            if d.name == name:
                return d
        return None

"""Semantic analysis: resolve names, infer element types, check TC's rules, plan range inference.

``check(program_or_def)`` returns a :class:`CheckedDef`: the AST plus what every later stage needs
(tensor table, per-statement index/reduction variables, element types of every expression, and the
range-inference *plan*: which access resolves which index in which round, §3.1).  All checks are
small named functions ``check_<property>`` raising a precise :class:`~..errors.TcError`.

Example:
    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> d = check(parse("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                 "{ C(m,n) +=! A(m,kk) * B(n,kk) }").defs[0])
    >>> d.stmts[0].lhs_vars, d.stmts[0].red_vars, d.tensors["C"].dtype
    (('m', 'n'), ('kk',), 'float')
"""
from __future__ import annotations

import dataclasses
import warnings

from ..errors import (Span, TcError, TcNameError, TcRangeError, TcSemanticError, TcTypeError,
                      TcWarning)
from . import ast as A
from .parser import parse
from .printer import expr_to_tc
from .types import canonical, is_float, is_int, promote, rank

__all__ = ["BUILTINS", "TensorInfo", "Constraint", "CheckedStmt", "CheckedDef", "check",
           "check_program", "linear_in", "guards"]

# builtin name -> (number of arguments, result: "float" (a float function), "same" (promote args),
# or a fixed type name)
BUILTINS: dict[str, tuple[int, str]] = {
    **{f: (1, "float") for f in ("exp", "log", "tanh", "sqrt", "sin", "cos", "tan", "erf",
                                 "log1p", "expm1", "floor", "ceil", "round", "rsqrt", "sigmoid",
                                 "log2", "exp2", "asin", "acos", "atan", "sinh", "cosh", "cbrt")},
    **{f + "f": (1, "float32") for f in ("exp", "log", "tanh", "sqrt", "sin", "cos", "tan",
                                         "erf", "log1p", "expm1", "floor", "ceil", "fabs")},
    "fabs": (1, "float"), "abs": (1, "same"),
    "fmax": (2, "float"), "fmin": (2, "float"), "fmaxf": (2, "float32"), "fminf": (2, "float32"),
    "max": (2, "same"), "min": (2, "same"), "pow": (2, "float"), "powf": (2, "float32"),
    "atan2": (2, "float"), "fmod": (2, "float"), "nextafter": (2, "float"),
    "nextafterf": (2, "float32"), "hypot": (2, "float"), "copysign": (2, "float"),
}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor of the TC: an input (``dims`` from the signature), an output or a temporary.

    Example:
        >>> d = check_program("def f(float(N) A) -> (B) { B(i) = A(i) }")["f"]
        >>> d.tensors["A"].kind, d.tensors["B"].kind, d.tensors["B"].dtype
        ('input', 'output', 'float')
    """

    name: str
    dtype: str
    rank: int
    kind: str                        # "input", "output" or "temp"
    dims: tuple[str | int, ...] | None
    span: Span
    defined_by: int | None = None    # index of the statement that first writes it


@dataclasses.dataclass(frozen=True)
class Constraint:
    """An access ``tensor(..., expr, ...)`` (at ``dim``) that bounds index variables.

    ``guard`` lists the conditions under which the access is evaluated, as ``(condition,
    holds)`` pairs (``c ? A(i) : ...`` reads ``A(i)`` only where ``c`` holds, ``c && A(i)``
    likewise): its bounds check only covers the points where every condition allows the read.

    Example:
        >>> d = check_program("def f(float(N) A) -> (B) { B(i) = A(i + 1) }")["f"]
        >>> c = d.stmts[0].checks[0]
        >>> c.tensor, c.dim
        ('A', 0)
    """

    tensor: str
    dim: int
    expr: A.Expr
    span: Span
    guard: tuple = ()


@dataclasses.dataclass(frozen=True)
class CheckedStmt:
    """One checked statement: its output (``lhs_vars``) and reduction (``red_vars``) index
    variables, element type, reads, and the order in which range inference bounds its variables.

    Example:
        >>> s = check_program("def f(float(N,K) A) -> (B) { B(n) +=! A(n,k) }")["f"].stmts[0]
        >>> s.lhs_vars, s.red_vars, s.dtype
        (('n',), ('k',), 'float')
    """
    index: int
    stmt: A.Stmt
    lhs_vars: tuple[str, ...]
    red_vars: tuple[str, ...]
    dtype: str                                        # element type of the LHS tensor
    reads: tuple[A.Call, ...]                         # tensor reads of the RHS (nested included)
    rounds: tuple[tuple[tuple[str, tuple[Constraint, ...]], ...], ...]
    where: dict                                       # var -> RangeConstraint
    checks: tuple[Constraint, ...]                    # every subscript, checked at call time
    bound_reads: tuple[A.Call, ...] = ()              # reads of ``where exists`` (not evaluated)

    @property
    def all_vars(self) -> tuple[str, ...]:
        return self.lhs_vars + self.red_vars

    @property
    def is_reduction(self) -> bool:
        return self.stmt.op != "="


@dataclasses.dataclass(frozen=True)
class CheckedDef:
    """A type-checked TC definition ready for range inference and lowering.

    Example:
        >>> d = check_program("def f(float(N) A, int32 k) -> (B) { B(i) = A(i) * k }")["f"]
        >>> d.name, d.sizes, [p.name for p in d.inputs], d.outputs
        ('f', ('N',), ['A', 'k'], ('B',))
    """

    ast: A.Def
    source: str
    tensors: dict                   # name -> TensorInfo (inputs, outputs, temporaries)
    scalars: dict                   # name -> dtype of scalar arguments
    sizes: tuple[str, ...]          # size parameters in order of first appearance
    stmts: tuple[CheckedStmt, ...]
    types: dict                     # id(expr node) -> element type
    structural_scalars: tuple[str, ...]   # int scalars used in subscripts/where (JIT-key them)
    plan_order: tuple[int, ...] = ()      # statements in range-inference order
    inout: tuple[str, ...] = ()           # outputs whose first write reduces into their contents

    @property
    def name(self) -> str:
        return self.ast.name

    @property
    def params(self) -> frozenset:
        """Names that are constants of one compilation: sizes and scalar arguments."""
        return frozenset(self.sizes) | frozenset(self.scalars)

    @property
    def inputs(self) -> tuple[A.Param, ...]:
        return self.ast.params

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.ast.returns

    @property
    def temps(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.tensors.items() if t.kind == "temp")

    def type_of(self, e: A.Expr) -> str:
        return self.types[id(e)]

    @property
    def index_inputs(self) -> tuple[str, ...]:
        """Input tensors whose values are subscripts (their values are bounds-checked per call)."""
        names = []
        for cs in self.stmts:
            for r in cs.reads + cs.bound_reads:
                for a in r.args:
                    for x in A.walk(a):
                        if isinstance(x, A.Call) and x.name in self.tensors and \
                                self.tensors[x.name].kind == "input":
                            names.append(x.name)
        return tuple(dict.fromkeys(names))


def check_program(source: str) -> dict[str, "CheckedDef"]:
    """Parse ``source`` and check every ``def``: name -> :class:`CheckedDef`, in source order.

    Raises:
        TcError: a syntax, name, type or semantic error (a def defined twice included).

    Example:
        >>> list(check_program("def f(float(N) A) -> (B) { B(i) = A(i) }  "
        ...                    "def g(float(N) A) -> (B) { B(i) = -A(i) }"))
        ['f', 'g']
    """
    prog = parse(source)
    out: dict[str, CheckedDef] = {}
    for d in prog.defs:
        if d.name in out:
            raise TcNameError(f"def {d.name} is defined twice", d.span, source)
        out[d.name] = check(d, source)
    return out


def guards(e: A.Expr, under: tuple = ()) -> dict[int, tuple]:
    """id(read) -> the conditions guarding it in ``e``: ``(condition, holds)`` pairs from the
    enclosing ``?:`` branches and the right operands of ``&&`` / ``||`` (evaluated only when the
    left one is true / false, as in C).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> from tfx_vec.tc_ops.lang.printer import expr_to_tc
        >>> [(expr_to_tc(c), holds) for g in guards(parse_expr("i > 0 ? A(i - 1) : 0")).values()
        ...  for c, holds in g]
        [('i > 0', True)]
    """
    out: dict[int, tuple] = {}
    if isinstance(e, A.Call):
        out[id(e)] = under
    if isinstance(e, A.Ternary):
        out.update(guards(e.cond, under))
        out.update(guards(e.then, under + ((e.cond, True),)))
        out.update(guards(e.other, under + ((e.cond, False),)))
    elif isinstance(e, A.Binary) and e.op in ("&&", "||"):
        out.update(guards(e.lhs, under))
        out.update(guards(e.rhs, under + ((e.lhs, e.op == "&&"),)))
    else:
        for c in A.children(e):
            out.update(guards(c, under))
    return out


def check(d: A.Def, source: str = "") -> CheckedDef:
    """Check one definition; errors carry ``source`` for their caret.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse
        >>> src = "def f(float(N) A) -> (B) { B(i) = A(i) + 1 }"
        >>> check(parse(src).defs[0], src).stmts[0].dtype
        'float'
    """
    try:
        return _Checker(d, source).run()
    except TcError as e:
        if e.source is None and source:
            e.with_source(source)
        raise


# -- linear decomposition (shared with range inference) ----------------------------------
def linear_in(e: A.Expr, v: str, params: frozenset = frozenset()
              ) -> tuple[A.Expr, A.Expr] | None:
    """Write ``e`` as ``coef * v + rest`` with ``v`` free in coef and rest; None if not linear.

    ``coef`` may only use literals and ``params`` (sizes, scalars); ``coef`` and ``rest`` are AST
    expressions (``IntLit(0)`` when absent).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> from tfx_vec.tc_ops.lang.printer import expr_to_tc
        >>> coef, rest = linear_in(parse_expr("2*i + j"), "i")
        >>> expr_to_tc(rest)
        '0 * 2 + j'
    """
    sp = getattr(e, "span", Span(0, 0))
    zero, one = A.IntLit(0, sp), A.IntLit(1, sp)
    if not _mentions(e, v):
        return zero, e
    if isinstance(e, A.Ident):
        return one, zero
    if isinstance(e, A.Unary) and e.op in "+-":
        r = linear_in(e.operand, v, params)
        if r is None or e.op == "+":
            return r
        return A.Unary("-", r[0], sp), A.Unary("-", r[1], sp)
    if isinstance(e, A.Binary) and e.op in ("+", "-"):
        a, b = linear_in(e.lhs, v, params), linear_in(e.rhs, v, params)
        if a is None or b is None:
            return None
        return A.Binary(e.op, a[0], b[0], sp), A.Binary(e.op, a[1], b[1], sp)
    if isinstance(e, A.Binary) and e.op == "*":
        if not _mentions(e.rhs, v):
            r, k = linear_in(e.lhs, v, params), e.rhs
        elif not _mentions(e.lhs, v):
            r, k = linear_in(e.rhs, v, params), e.lhs
        else:
            return None
        if r is None or _has_read(k) or _index_idents(k, params):
            return None
        return A.Binary("*", r[0], k, sp), A.Binary("*", r[1], k, sp)
    return None


def _mentions(e: A.Expr, v: str) -> bool:
    return any(isinstance(x, A.Ident) and x.name == v for x in A.walk(e))


def _has_read(e: A.Expr) -> bool:
    return any(isinstance(x, A.Call) for x in A.walk(e))


def _index_idents(e: A.Expr, known: frozenset = frozenset()) -> set:
    return {x.name for x in A.walk(e) if isinstance(x, A.Ident) and x.name not in known}


class _Checker:
    def __init__(self, d: A.Def, source: str):
        self.d, self.source = d, source
        self.tensors: dict[str, TensorInfo] = {}
        self.scalars: dict[str, str] = {}
        self.sizes: list[str] = []
        self.types: dict[int, str] = {}
        self.weak: set[int] = set()            # ids of literal-typed (adaptable) expressions
        self.structural: list[str] = []
        self.inout: list[str] = []

    def err(self, cls, msg: str, span: Span) -> TcError:
        return cls(f"in def {self.d.name}: {msg}", span, self.source or None)

    def run(self) -> CheckedDef:
        self.check_signature()
        infos = [self.check_stmt(k, s) for k, s in enumerate(self.d.stmts)]
        self.check_outputs_written()
        plans, order = self.plan_all([i[1] for i in infos])
        stmts = tuple(dataclasses.replace(cs, rounds=rounds, checks=checks)
                      for (cs, _), (rounds, checks) in zip(infos, plans))
        return CheckedDef(self.d, self.source, dict(self.tensors), dict(self.scalars),
                          tuple(self.sizes), stmts, self.types,
                          tuple(dict.fromkeys(self.structural)), order, tuple(self.inout))

    # -- signature -----------------------------------------------------------------------
    def check_signature(self) -> None:
        seen: dict[str, Span] = {}
        for p in self.d.params:
            if p.name in seen:
                raise self.err(TcNameError, f"parameter {p.name!r} is declared twice", p.span)
            seen[p.name] = p.span
            if p.is_scalar:
                self.scalars[p.name] = p.dtype
            else:
                self.tensors[p.name] = TensorInfo(p.name, p.dtype, len(p.dims), "input", p.dims,
                                                  p.span)
                for dim, sp in zip(p.dims, p.dim_spans):
                    if isinstance(dim, str):
                        if dim in self.scalars:   # sizes and tensors are separate namespaces
                            raise self.err(TcNameError, f"size {dim!r} is also a scalar "
                                           "parameter", sp)
                        if dim not in self.sizes:
                            self.sizes.append(dim)
        for name in self.d.params:
            if name.is_scalar and name.name in self.sizes:
                raise self.err(TcNameError, f"scalar parameter {name.name!r} is also a size "
                               "name", name.span)
        for r, sp in zip(self.d.returns, self.d.return_spans):
            if r in seen:
                raise self.err(TcNameError, f"output {r!r} is also an input parameter", sp)
            if self.d.returns.count(r) > 1:
                raise self.err(TcNameError, f"output {r!r} is listed twice", sp)
            declared = self.d.return_type(r)
            for dim, dsp in zip((declared.dims or ()) if declared else (),
                                declared.dim_spans if declared else ()):
                if isinstance(dim, str) and dim not in self.sizes:
                    raise self.err(TcNameError, f"output {r} is declared with size {dim!r}, "
                                   "which no input declares", dsp)

    def check_outputs_written(self) -> None:
        for r, sp in zip(self.d.returns, self.d.return_spans):
            if r not in self.tensors:
                raise self.err(TcNameError, f"output {r!r} is never written", sp)

    # -- statements ----------------------------------------------------------------------
    def check_stmt(self, k: int, s: A.Stmt) -> CheckedStmt:
        self.check_lhs(s)
        lhs_info = self.tensors.get(s.lhs)
        if lhs_info is not None and lhs_info.rank != len(s.lhs_indices):
            raise self.err(TcTypeError, f"{s.lhs} has {lhs_info.rank} dimension(s) but is "
                           f"written with {len(s.lhs_indices)} index(es)", s.span)
        first_def = lhs_info is None
        declared = self.d.return_type(s.lhs)
        if first_def and declared is not None and len(declared.dims or ()) != \
                len(s.lhs_indices):
            raise self.err(TcTypeError, f"{s.lhs} is declared as an output with "
                           f"{len(declared.dims or ())} dimension(s) but written with "
                           f"{len(s.lhs_indices)} index(es)", s.span)
        if first_def and s.op != "=" and not s.init:
            self.warn_uninitialised(s)
        names = self.known_names()
        index_vars = list(s.lhs_indices)
        for root in (s.rhs, *s.exists):
            for e in A.walk(root):
                if isinstance(e, A.Ident) and e.name not in names and e.name not in index_vars:
                    index_vars.append(e.name)
        for rc in s.where:
            for e in (rc.lo, rc.hi):
                for x in A.walk(e):
                    if isinstance(x, A.Ident) and x.name not in self.sizes \
                            and x.name not in self.scalars:
                        raise self.err(TcNameError, f"where-clause bound uses {x.name!r}, which"
                                       " is not a size or scalar parameter", x.span)
            self.structural.extend(self.scalar_idents(rc.lo) + self.scalar_idents(rc.hi))
        red_vars = tuple(v for v in index_vars if v not in s.lhs_indices)
        where = {}
        for rc in s.where:
            if rc.var not in index_vars:
                raise self.err(TcNameError, f"where-clause constrains {rc.var!r}, which the "
                               "statement does not use", rc.span)
            if rc.var in where:
                raise self.err(TcSemanticError, f"{rc.var!r} is constrained twice", rc.span)
            where[rc.var] = rc
        if s.op == "=" and red_vars:
            v = red_vars[0]
            raise self.err(TcSemanticError,
                           f"index {v!r} appears only on the right of '=': a reduction needs a "
                           "reduction operator (+=!, *=!, min=!, max=! or their non-initialising "
                           "forms)", self.first_use(s.rhs, v))
        reads: list[A.Call] = []
        rtype, weak = self._type(s.rhs, s, set(index_vars), reads)
        bound_reads: list[A.Call] = []
        for e in s.exists:
            self._type(e, s, set(index_vars), bound_reads)
        self.check_reads_defined(s, reads + bound_reads, first_def)
        self.check_in_place(s, reads)
        if declared is not None:
            self.check_narrowing(s, rtype, weak, declared)
        dtype = declared.dtype if declared else lhs_info.dtype if lhs_info else (
            rtype if rtype != "bool" or s.op == "=" else "int32")
        if first_def:
            kind = "output" if s.lhs in self.d.returns else "temp"
            self.tensors[s.lhs] = TensorInfo(s.lhs, dtype, len(s.lhs_indices), kind,
                                             declared.dims if declared else None, s.span, k)
            if kind == "output" and s.op != "=" and not s.init:
                self.inout.append(s.lhs)
        self.check_mixed_reduction(k, s)
        cs = CheckedStmt(k, s, tuple(s.lhs_indices), red_vars, dtype, tuple(reads), (), where, (),
                         tuple(bound_reads))
        return cs, (s, index_vars, where, reads, bound_reads)

    def warn_uninitialised(self, s: A.Stmt) -> None:
        """A non-initialising reduction into a tensor no earlier statement writes: as in the
        original, it reduces into the tensor's contents (an output's are the caller's
        ``outputs=`` values, else zeros; a temporary's are zeros)."""
        where = ("the values passed with outputs=, or zeros" if s.lhs in self.d.returns
                 else "zeros (it is a temporary)")
        warnings.warn(TcWarning(f"in def {self.d.name}: {s.lhs} is reduced with {s.op} without "
                                f"being initialised: it starts from {where}; use {s.op}! to "
                                "start from the reduction's neutral element", s.span,
                                self.source or None), stacklevel=4)

    def check_narrowing(self, s: A.Stmt, rtype: str, weak: bool, declared: A.Param) -> None:
        """A declared output type is never silently narrowed (write an explicit cast)."""
        t = declared.dtype
        if weak or rtype == t or rtype == "bool":
            return
        wider = (is_float(rtype) and not is_float(t)) or (
            is_float(rtype) == is_float(t) and rank(rtype) > rank(t))
        if wider:
            raise self.err(TcTypeError, f"{s.lhs} is declared {t} but the right side has type "
                           f"{rtype}; write an explicit cast, e.g. {t}(...)", s.span)

    def params(self) -> frozenset:
        return frozenset(self.sizes) | frozenset(self.scalars)

    def known_names(self) -> set:
        return set(self.tensors) | set(self.scalars) | set(self.sizes)

    def scalar_idents(self, e: A.Expr) -> list:
        return [x.name for x in A.walk(e) if isinstance(x, A.Ident) and x.name in self.scalars]

    def first_use(self, e: A.Expr, v: str) -> Span:
        for x in A.walk(e):
            if isinstance(x, A.Ident) and x.name == v:
                return x.span
        return e.span

    def check_lhs(self, s: A.Stmt) -> None:
        if s.lhs in self.scalars or (s.lhs in self.tensors and
                                      self.tensors[s.lhs].kind == "input"):
            raise self.err(TcSemanticError, f"cannot write to input {s.lhs!r}", s.span)
        for i, (v, sp) in enumerate(zip(s.lhs_indices, s.lhs_index_spans)):
            if v in s.lhs_indices[:i]:
                raise self.err(TcSemanticError, f"index {v!r} is used twice on the left side "
                               f"of {s.lhs}", sp)
            if v in self.known_names():
                raise self.err(TcNameError, f"left-side index {v!r} is already the name of a "
                               "tensor, scalar or size", sp)

    def check_reads_defined(self, s: A.Stmt, reads: list, first_def: bool) -> None:
        for r in reads:
            if r.name == s.lhs and first_def:
                raise self.err(TcNameError, f"{r.name} is read before it is defined", r.span)

    def check_in_place(self, s: A.Stmt, reads: list) -> None:
        """An in-place update may read its LHS tensor only pointwise (same indices)."""
        for r in reads:
            if r.name != s.lhs:
                continue
            same = all(isinstance(a, A.Ident) and a.name == v
                       for a, v in zip(r.args, s.lhs_indices))
            if not same:
                shown = ", ".join(s.lhs_indices)
                raise self.err(TcSemanticError,
                               f"in-place update of {s.lhs}({shown}) reads {s.lhs} at other "
                               "indices; TC reads the right side in full before writing, so "
                               "this breaks the read-before-write semantics (write to a new "
                               "tensor instead)", r.span)
            if s.op != "=" and self.stmt_red_vars(s):
                raise self.err(TcSemanticError,
                               f"reduction into {s.lhs} also reads {s.lhs} on the right side; "
                               "reduce into a new tensor instead", r.span)

    def stmt_red_vars(self, s: A.Stmt) -> list:
        names = self.known_names()
        return [x.name for x in A.walk(s.rhs) if isinstance(x, A.Ident)
                and x.name not in names and x.name not in s.lhs_indices]

    def check_mixed_reduction(self, k: int, s: A.Stmt) -> None:
        """Consecutive non-initialising reductions into a tensor must share one operator."""
        if s.op == "=" or s.init:
            return
        for prev in reversed(self.d.stmts[:k]):
            if prev.lhs != s.lhs:
                continue
            if prev.op != "=" and prev.op != s.op:
                raise self.err(TcSemanticError,
                               f"mixed reduction operators on {s.lhs}: {s.op} after "
                               f"{prev.op}{'!' if prev.init else ''} at {prev.span}; "
                               "min/max/+/* do not commute with each other", s.span)
            return

    # -- types ---------------------------------------------------------------------------
    def expr_type(self, e: A.Expr, s: A.Stmt, index_vars: set, reads: list) -> str:
        t, weak = self._type(e, s, index_vars, reads)
        return t

    def _set(self, e, t: str, weak: bool = False) -> tuple[str, bool]:
        self.types[id(e)] = t
        if weak:
            self.weak.add(id(e))
        return t, weak

    def _type(self, e, s, iv, reads) -> tuple[str, bool]:
        rec = lambda x: self._type(x, s, iv, reads)  # noqa: E731
        if isinstance(e, A.IntLit):
            return self._set(e, "int32", True)
        if isinstance(e, A.FloatLit):
            return self._set(e, "float" if e.text[-1] in "fF" else "float", True)
        if isinstance(e, A.Ident):
            if e.name in self.scalars:
                return self._set(e, self.scalars[e.name])
            if e.name in self.sizes or e.name in iv:
                return self._set(e, "int32", True)
            if e.name in self.tensors:
                raise self.err(TcTypeError, f"tensor {e.name!r} used without subscripts",
                               e.span)
            raise self.err(TcNameError, f"undefined name {e.name!r}", e.span)  # pragma: no cover
        if isinstance(e, A.DimRef):
            t = self.tensors.get(e.name)
            if t is None:
                raise self.err(TcNameError, f"{e.name!r} is not a tensor", e.span)
            if not 0 <= e.dim < t.rank:
                raise self.err(TcTypeError, f"{e.name}.{e.dim}: {e.name} has {t.rank} "
                               "dimension(s)", e.span)
            return self._set(e, "int32", True)
        if isinstance(e, A.Unary):
            t, w = rec(e.operand)
            if e.op == "!":
                return self._set(e, "bool")
            return self._set(e, t, w)
        if isinstance(e, A.Binary):
            (a, wa), (b, wb) = rec(e.lhs), rec(e.rhs)
            if e.op in ("==", "!=", "<", "<=", ">", ">=", "&&", "||"):
                return self._set(e, "bool")
            t, w = self.join(a, wa, b, wb)
            if e.op == "%" and not is_int(t):
                raise self.err(TcTypeError, f"'%' needs integer operands, got {a} and {b} "
                               "(use fmod for floats)", e.span)
            return self._set(e, t, w)
        if isinstance(e, A.Ternary):
            rec(e.cond)
            (a, wa), (b, wb) = rec(e.then), rec(e.other)
            return self._set(e, *self.join(a, wa, b, wb))
        if isinstance(e, A.Call):
            return self.call_type(e, s, iv, reads, rec)
        raise TypeError(e)  # pragma: no cover

    def join(self, a: str, wa: bool, b: str, wb: bool) -> tuple[str, bool]:
        if wa and not wb:
            return (b if (is_float(b) or not is_float(a)) else a), False
        if wb and not wa:
            return (a if (is_float(a) or not is_float(b)) else b), False
        return promote(a, b), wa and wb

    def call_type(self, e: A.Call, s, iv, reads, rec) -> tuple[str, bool]:
        if e.name in self.tensors or e.name == s.lhs:
            info = self.tensors.get(e.name)
            rank = info.rank if info else len(s.lhs_indices)
            if len(e.args) != rank:
                raise self.err(TcTypeError, f"{e.name} has {rank} dimension(s) but is "
                               f"accessed with {len(e.args)} subscript(s)", e.span)
            for a in e.args:
                t, _ = rec(a)
                if not is_int(t):
                    raise self.err(TcTypeError, f"subscript of {e.name} has type {t}; "
                                   "subscripts must be integers", getattr(a, "span", e.span))
                self.structural.extend(self.scalar_idents(a))
            reads.append(e)
            if info is None:
                raise self.err(TcNameError, f"{e.name} is read before it is defined", e.span)
            return self._set(e, info.dtype)
        if e.name in self.scalars:
            raise self.err(TcTypeError, f"scalar {e.name!r} cannot be subscripted", e.span)
        cast = canonical(e.name)
        if cast is not None:
            if len(e.args) != 1:
                raise self.err(TcTypeError, f"cast {e.name}(...) takes 1 argument, got "
                               f"{len(e.args)}", e.span)
            rec(e.args[0])
            return self._set(e, cast)
        if e.name in BUILTINS:
            n, res = BUILTINS[e.name]
            if len(e.args) != n:
                raise self.err(TcTypeError, f"{e.name} takes {n} argument(s), got "
                               f"{len(e.args)}", e.span)
            ts = [rec(a) for a in e.args]
            t, w = ts[0]
            for b, wb in ts[1:]:
                t, w = self.join(t, w, b, wb)
            if res == "float32":
                return self._set(e, "float")
            if res == "float":
                return self._set(e, t if is_float(t) else "float", w and not is_float(t))
            return self._set(e, t, w)
        if e.name in self.sizes:
            raise self.err(TcTypeError, f"{e.name!r} is a size, not a tensor or function",
                           e.span)
        raise self.err(TcNameError, f"undefined tensor or function {e.name!r}", e.span)

    # -- range-inference plan (§3.1) -----------------------------------------------------
    def plan_all(self, stmts: list) -> tuple[list, tuple[int, ...]]:
        """Rounds per statement and the order in which statements are inferred.

        Each round resolves the unresolved indices that occur alone (and linearly) in a subscript
        of a tensor whose size is known; the intervals themselves are computed at call time
        (``lang.ranges``).  A statement whose only unresolved indices index its own, not yet
        sized, left-hand tensor (``O(b,n) = bias(n)`` before ``O(b,n) += I(b,m) * W(n,m)``) is
        deferred until a later statement sizes that tensor.
        """
        sized = {n for n, t in self.tensors.items() if t.kind == "input"}
        plans: dict[int, tuple] = {}
        order: list[int] = []
        deferred: list[int] = []
        for final in (False, True):
            todo = deferred if final else range(len(stmts))
            deferred = []
            for k in todo:
                plan = self.plan_stmt(stmts[k], sized, final)
                if plan is None:
                    deferred.append(k)
                    continue
                plans[k] = plan
                order.append(k)
                sized.add(stmts[k][0].lhs)
        return [plans[k] for k in range(len(stmts))], tuple(order)

    def plan_stmt(self, info: tuple, sized: set, final: bool):
        s, index_vars, where, reads, bound_reads = info
        guarded = guards(s.rhs)
        accesses: list[Constraint] = []
        for r in reads + bound_reads:
            for dim, a in enumerate(r.args):
                accesses.append(Constraint(r.name, dim, a, A.start_span(a),
                                           guarded.get(id(r), ())))
        lhs_access = [Constraint(s.lhs, dim, A.Ident(v, sp), sp)
                      for dim, (v, sp) in enumerate(zip(s.lhs_indices, s.lhs_index_spans))]
        usable = [c for c in accesses if c.tensor in sized]
        if s.lhs in sized:
            usable += lhs_access
        unresolved = [v for v in index_vars if v not in where]
        rounds = []
        while unresolved:
            this_round: dict[str, list[Constraint]] = {}
            for c in usable:
                if _has_read(c.expr):
                    continue
                free = [v for v in unresolved if _mentions(c.expr, v)]
                if len(free) == 1 and linear_in(c.expr, free[0], self.params()) is not None:
                    this_round.setdefault(free[0], []).append(c)
            if not this_round:
                if not final and s.lhs not in sized and all(v in s.lhs_indices
                                                            for v in unresolved):
                    return None
                v = unresolved[0]
                multi = [c for c in usable if _mentions(c.expr, v) and not _has_read(c.expr)]
                why = ("it only occurs together with other unresolved indices "
                       f"(e.g. in {self.show(multi[0])})" if multi else
                       "it does not index any tensor whose size is known")
                raise self.err(TcRangeError,
                               f"cannot infer the range of index {v!r}: {why}; add "
                               f"'where {v} in <lo>:<hi>'", self.first_use_stmt(s, v))
            rounds.append(tuple((v, tuple(cs)) for v, cs in this_round.items()))
            unresolved = [v for v in unresolved if v not in this_round]
        return tuple(rounds), tuple(accesses + lhs_access)

    def first_use_stmt(self, s: A.Stmt, v: str) -> Span:
        for i, sp in zip(s.lhs_indices, s.lhs_index_spans):
            if i == v:
                return sp
        return self.first_use(s.rhs, v)

    def show(self, c: Constraint) -> str:
        return f"{c.tensor}(...{expr_to_tc(c.expr)}...)"

"""Symbolic differentiation of a Tensor Comprehension into a backward TC (reverse mode).

The paper leaves gradients of TCs as future work; this module derives them on the TC itself, so
the backward pass goes through the same compiler (scheduling, mapping, tuning, caching).

Given ``def f(inputs) -> (outputs) { statements }`` it writes
``def f_grad(inputs, d_<output>...) -> (d_<input>...)`` that

1. recomputes the forward statements with every write renamed to a fresh *version* (SSA), so an
   in-place chain such as fcrelu's ``O = bias; O += I*W; O = fmaxf(O, 0)`` keeps each value;
2. walks the statements backwards and, for each tensor access ``X(i, j)`` on a right-hand side,
   accumulates ``d_X(i, j) += d_T(lhs) * dRHS/dX(i, j)`` (the chain rule over a comprehension:
   indices of the left side not in ``X``'s subscripts are summed over, as in a TC reduction);
3. ``max=``/``min=`` send the gradient to the elements equal to the result; a non-initialising
   ``+=`` also passes ``d_T`` through to the previous version.

Supported: ``=``, ``+=``, ``+=!``, ``max=``, ``max=!``, ``min=``, ``min=!``; arithmetic, ``?:``,
casts and the builtins in :data:`_DERIVATIVES`; any subscript: distinct plain indices directly,
others (``I(h + kh)``, constants, ``LUT(I(b,l), d)``) through a fresh index over the dimension
and a one-hot factor (exact; a convolution's input gradient then costs a loop over the input
extent more than a hand-written one).  Limits (a :class:`TcGradientError` names the TC line and
column): ``*=`` reductions, builtins without a derivative rule.

Example:
    >>> src = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
    >>> print(backward_tc(src, "tmm").source)  # doctest: +NORMALIZE_WHITESPACE
    def tmm_grad(float(M,K) A, float(N,K) B, float(D_C_0,D_C_1) d_C) -> (d_A, d_B) {
        d_A(i0,i1) = float(0) where i0 in 0:M, i1 in 0:K
        d_A(m,kk) += d_C(m,n) * B(n,kk)
        d_B(i0,i1) = float(0) where i0 in 0:N, i1 in 0:K
        d_B(n,kk) += d_C(m,n) * A(m,kk)
    }

Shape-generic as above, an input's gradient starts as zeros over the whole input; derived at
concrete shapes (``ranges=``, what the TC ops do at each run's shapes) every statement runs over
exactly its forward statement's ranges and a gradient that covers the input is reduced with
``+=!`` directly.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from .errors import TcGradientError
from .lang import ast as A
from .lang.parser import parse, parse_expr
from .lang.printer import expr_to_tc
from .lang.sema import BUILTINS, check
from .lang.types import canonical, is_float

__all__ = ["backward_tc", "BackwardTc", "TcGradientError"]


@dataclasses.dataclass(frozen=True)
class BackwardTc:
    """A derived backward TC.

    ``source`` defines ``entry``; its parameters are the forward inputs followed by one gradient
    per forward output (``d_<name>``), and it returns ``d_<input>`` for each name of ``wrt``.

    Example:
        >>> b = backward_tc("def rs(float(N,K) A) -> (S) { S(n) +=! A(n,k) }", "rs")
        >>> b.entry, b.wrt, b.outputs
        ('rs_grad', ('A',), ('S',))
    """

    source: str
    entry: str
    wrt: tuple[str, ...]
    outputs: tuple[str, ...]


# -- expression text -------------------------------------------------------------------------
def _text(e: A.Expr, rename: Callable[[str], str]) -> str:
    """TC text of ``e``, fully parenthesised (the text algebra below splices it); tensors
    renamed."""
    return expr_to_tc(e, rename=rename, full=True)


# Symbolic text algebra; None is the zero, ONE the unit (a float literal, so a quotient with it
# is never an integer division).
ONE = "1.0f"


def _mul(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return None
    if a == ONE:
        return b
    if b == ONE:
        return a
    return f"{a} * {b}" if _atomic(a) and _atomic(b) else f"({a}) * ({b})"


def _atomic(s: str) -> bool:
    """Whether ``s`` can be an operand of ``*`` without parentheses."""
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and ch in "+-?:<>=&|" and s[0] != "-":
            return False
    return True


def _add(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return f"({a} + {b})"


def _neg(a: str | None) -> str | None:
    return None if a is None else f"-({a})"


def _select(cond: str) -> str:
    return f"({cond} ? 1.0f : 0.0f)"


# d f(x...)/dx_k as text, given the argument texts and the call's own text.
_DERIVATIVES: dict[str, Callable[[list[str], str, int], str]] = {
    "exp": lambda a, f, k: f,
    "log": lambda a, f, k: f"(1.0f / {a[0]})",
    "tanh": lambda a, f, k: f"(1.0f - {f} * {f})",
    "sqrt": lambda a, f, k: f"(0.5f / {f})",
    "rsqrt": lambda a, f, k: f"(-0.5f * {f} / {a[0]})",
    "sin": lambda a, f, k: f"cos({a[0]})",
    "cos": lambda a, f, k: f"-(sin({a[0]}))",
    "abs": lambda a, f, k: f"({a[0]} >= 0 ? 1.0f : -1.0f)",
    "fabs": lambda a, f, k: f"({a[0]} >= 0 ? 1.0f : -1.0f)",
    "sigmoid": lambda a, f, k: f"({f} * (1.0f - {f}))",
}
for _name in ("fmaxf", "fmax", "max"):
    _DERIVATIVES[_name] = lambda a, f, k: _select(
        f"{a[0]} >= {a[1]}" if k == 0 else f"{a[1]} > {a[0]}")
for _name in ("fminf", "fmin", "min"):
    _DERIVATIVES[_name] = lambda a, f, k: _select(
        f"{a[0]} <= {a[1]}" if k == 0 else f"{a[1]} < {a[0]}")
for _name in ("expf", "logf", "tanhf", "sqrtf", "sinf", "cosf", "fabsf"):
    _DERIVATIVES[_name] = _DERIVATIVES[_name[:-1]]
_NON_DIFFERENTIABLE = ("==", "!=", "<", "<=", ">", ">=", "&&", "||", "%")


class _Differ:
    """d(expr)/d(one occurrence of a tensor access), as TC text."""

    def __init__(self, tensors: set[str], rename: Callable[[str], str], source: str):
        self.tensors, self.rename, self.source = tensors, rename, source

    def __call__(self, e: A.Expr, target: A.Call) -> str | None:
        t = lambda x: _text(x, self.rename)  # noqa: E731
        if e is target:
            return ONE
        if isinstance(e, (A.IntLit, A.FloatLit, A.Ident, A.DimRef)):
            return None
        if isinstance(e, A.Unary):
            d = self(e.operand, target)
            return _neg(d) if e.op == "-" else (d if e.op == "+" else None)
        if isinstance(e, A.Ternary):
            dt, do = self(e.then, target), self(e.other, target)
            if dt is None and do is None:
                return None
            return f"({t(e.cond)} ? {dt or '0.0f'} : {do or '0.0f'})"
        if isinstance(e, A.Binary):
            if e.op in _NON_DIFFERENTIABLE:
                return None
            dl, dr = self(e.lhs, target), self(e.rhs, target)
            if e.op == "+":
                return _add(dl, dr)
            if e.op == "-":
                return _add(dl, _neg(dr))
            if e.op == "*":
                return _add(_mul(dl, t(e.rhs)), _mul(t(e.lhs), dr))
            if e.op == "/":  # (l/r)' = l'/r - l r'/r^2
                q = None if dl is None else f"({dl}) / {t(e.rhs)}"
                p = None if dr is None else f"({t(e.lhs)}) * ({dr}) / ({t(e.rhs)} * {t(e.rhs)})"
                return _add(q, _neg(p))
        if isinstance(e, A.Call):
            if e.name in self.tensors:
                return None  # another access (or another occurrence of the same one)
            if canonical(e.name) is not None:  # a cast
                return self(e.args[0], target) if is_float(canonical(e.name)) else None
            total = None
            args = [t(a) for a in e.args]
            for k, arg in enumerate(e.args):
                d = self(arg, target)
                if d is None:
                    continue
                rule = _DERIVATIVES.get(e.name)
                if rule is None:
                    raise TcGradientError(f"no derivative rule for builtin {e.name}() "
                                          "(give a backward TC)", e.span, self.source)
                total = _add(total, _mul(rule(args, t(e), k), d))
            return total
        raise TcGradientError(f"cannot differentiate {type(e).__name__}", e.span, self.source)


@dataclasses.dataclass
class _Version:
    """One SSA value of a written tensor: ``name`` as computed by statement ``stmt``."""

    tensor: str
    name: str
    rank: int
    grad: str | None = None      # name of its adjoint once some contribution exists
    n_contrib: int = 0


def backward_tc(source: str, entry: str, wrt: Sequence[str] | None = None,
                ranges: Any = None) -> BackwardTc:
    """Derive the backward TC of ``entry`` in ``source``.

    Args:
      wrt: the inputs to differentiate (default: every floating-point tensor input).
      ranges: the forward's :class:`~.lang.ranges.Ranges` at the shapes the gradient is for.
        With them every derived statement runs over exactly the index ranges its forward
        statement ran over (``where`` clauses with those bounds) and outputs whose range does
        not start at 0 have their gradient read shifted; without them (a shape-generic backward
        TC) the ranges are left to range inference.
    Raises:
      TcGradientError: with line/column when a statement cannot be differentiated.

    Example:
        >>> print(backward_tc("def rs(float(N,K) A) -> (S) { S(n) +=! A(n,k) }", "rs").source)
        def rs_grad(float(N,K) A, float(D_S_0) d_S) -> (d_A) {
            d_A(i0,i1) = float(0) where i0 in 0:N, i1 in 0:K
            d_A(n,k) += d_S(n) where k in 0:K
        }
        >>> backward_tc("def p(float(N,K) A) -> (P) { P(n) *=! A(n,k) }", "p")
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcGradientError: line 1, column 30: automatic gradients of *= reductions are ...
        ...
    """
    prog = parse(source)
    d = prog.get(entry)
    if d is None:
        raise TcGradientError(f"no def named {entry!r} (defs: {[x.name for x in prog.defs]})")
    checked = check(d, source)
    params = {p.name: p for p in d.params}
    float_inputs = [p.name for p in d.params if not p.is_scalar and is_float(canonical(p.dtype))]
    wrt = tuple(float_inputs if wrt is None else wrt)
    if not wrt:
        raise TcGradientError(f"{entry}: nothing to differentiate (no floating-point input)")
    for name in wrt:
        if name not in float_inputs:
            raise TcGradientError(f"{entry}: cannot differentiate with respect to {name!r}: "
                                  f"not a floating-point tensor input (those are {float_inputs})")
    written = {s.lhs for s in d.stmts}
    tensors = set(params) | written
    dtype = "double" if any(canonical(params[n].dtype) == "double" for n in wrt) else "float"
    box = _Box(ranges, d)

    # 1. forward recomputation in SSA form
    current: dict[str, str] = {n: n for n in params}
    versions: list[_Version] = []
    reads: list[dict[str, str]] = []   # per statement: tensor -> version name it reads
    count: dict[str, int] = {}
    for s in d.stmts:
        reads.append(dict(current))
        count[s.lhs] = count.get(s.lhs, 0) + 1
        versions.append(_Version(s.lhs, f"{s.lhs}_v{count[s.lhs]}", len(s.lhs_indices)))
        if s.op != "=" and not s.init and (s.lhs not in current or s.lhs in params):
            raise TcGradientError(f"{s.lhs} is reduced with {s.op} into its initial contents, "
                                  "which this TC does not take as an input: call it through "
                                  "tc.define (its entries pass the initial outputs), or use "
                                  f"{s.op}!", s.span, source)
        current[s.lhs] = versions[-1].name
    writer = {v.name: (s, rd) for s, v, rd in zip(d.stmts, versions, reads)}
    size_of = _sizer(params, writer, versions,
                     lambda e, rd: _text(e, lambda n: rd.get(n, n)))
    lines: list[str] = []
    for k, (s, v, rd) in enumerate(zip(d.stmts, versions, reads)):
        rn = rd.get
        lhs = f"{v.name}({','.join(s.lhs_indices)})"
        rhs = _text(s.rhs, lambda n: rn(n, n))
        # every version is a tensor of its own: bound the left indices its statement leaves
        # unbounded (e.g. "b" in fcrelu's "O(b,n) = bias(n)") by the tensor's size
        where = _join_where(_where(s, rn), box.stmt(k, s, s.lhs_indices + checked.stmts[k].red_vars)
                            if box else _range_for(list(s.lhs_indices), rhs, s, v.name,
                                                   size_of))
        if s.op == "=" or s.init:
            lines.append(f"{lhs} {s.op}{'!' if s.init else ''} {rhs}{where}")
        else:   # the previous version, over this statement's left indices, then the update
            copy = _join_where(_where(s, rn, ranges_only=s.lhs_indices),
                               box.stmt(k, s, s.lhs_indices) if box else "")
            lines.append(f"{lhs} = {rd[s.lhs]}({','.join(s.lhs_indices)}){copy}")
            lines.append(f"{lhs} {s.op} {rhs}{where}")

    # 2. adjoints, statements in reverse order
    grads: dict[str, _Version] = {v.name: v for v in versions}
    input_grads = {n: _Version(n, n, len(params[n].dims or ())) for n in wrt}
    back: list[str] = []

    def zeros(n: str) -> str:
        """``d_n = 0`` over the whole input (its gradient starts there unless the first
        contribution covers every element)."""
        g = input_grads[n]
        g.grad, g.n_contrib = f"d_{n}", 1
        idx = [f"i{k}" for k in range(g.rank)]
        full = ", ".join(f"{i} in 0:{dim}" for i, dim in zip(idx, params[n].dims))
        return f"d_{n}({','.join(idx)}) = {canonical(params[n].dtype)}(0)" + (
            f" where {full}" if full else "")

    read_later = {name for rd in reads for name in rd.values()}
    shifted = {f"d_{out}": o for out, o in box.origins.items() if out in d.returns}

    def read(grad: str, idx: Sequence[str]) -> str:
        """``grad(idx)``; an output's gradient (indexed from 0) read at its range's indices."""
        o = shifted.get(grad, (0,) * len(idx))
        return f"{grad}({','.join(f'{i} - {k}' if k else i for i, k in zip(idx, o))})"

    for out in d.returns:
        v = grads[current[out]]
        if v.name in read_later:  # later statements add to it: copy the incoming gradient
            idx = [f"i{k}" for k in range(v.rank)]
            v.grad, v.n_contrib = f"d_{v.name}", 1
            o = shifted.get(f"d_{out}", ())
            where = ", ".join(f"{i} in {k}:{k} + D_{out}_{n}" for n, (i, k) in
                              enumerate(zip(idx, o)) if k)
            back.append(f"{v.grad}({','.join(idx)}) = {read(f'd_{out}', idx)}"
                        + (f" where {where}" if where else ""))
        else:
            v.grad = f"d_{out}"
    for k in reversed(range(len(d.stmts))):
        s, v, rd = d.stmts[k], versions[k], reads[k]
        if v.grad is None:
            continue  # nothing downstream depends on this value
        rn = rd.get
        rename = lambda n: rn(n, n)  # noqa: E731
        lhs_idx = ",".join(s.lhs_indices)
        seed = read(v.grad, s.lhs_indices)
        if s.op in ("min=", "max="):
            seed = f"{seed} * {_select(f'{_text(s.rhs, rename)} == {v.name}({lhs_idx})')}"
        elif s.op == "*=":
            raise TcGradientError("automatic gradients of *= reductions are not supported "
                                  "(give a backward TC)", s.span, source)
        differ = _Differ(tensors, rename, source)
        where = _where(s, rn)
        all_vars = s.lhs_indices + checked.stmts[k].red_vars
        for acc in (e for e in A.walk(s.rhs) if isinstance(e, A.Call) and e.name in tensors):
            src_version = rn(acc.name, acc.name)
            target = input_grads.get(acc.name) if acc.name in params else grads.get(src_version)
            if target is None:
                continue
            partial = differ(s.rhs, acc)
            if partial is None:
                continue
            subs, onehot, fresh = _subscripts(acc, rename, size_of, src_version)
            contrib = _mul(_mul(seed, partial), onehot) if onehot else _mul(seed, partial)
            extra = box.stmt(k, s, all_vars) if box else _range_for(
                [x for x in subs if not x.startswith("_g")], contrib, s, src_version, size_of)
            if acc.name in params and target.n_contrib == 0 and not box.covers(k, subs,
                                                                                acc.name):
                back.append(zeros(acc.name))
            back.append(_accumulate(target, subs, contrib,
                                    _join_where(_join_where(where, extra), fresh)))
        if s.op != "=" and not s.init:  # T_k = T_{k-1} (op) reduction: pass through
            prev = grads[rd[s.lhs]]
            passed = read(v.grad, s.lhs_indices)
            if s.op in ("min=", "max="):
                passed += f" * {_select(f'{rd[s.lhs]}({lhs_idx}) == {v.name}({lhs_idx})')}"
            back.append(_accumulate(prev, list(s.lhs_indices), passed,
                                    _join_where(where, box.stmt(k, s, s.lhs_indices)
                                                if box else "")))

    # an input nothing depends on differentiably: its gradient is zero
    back += [zeros(n) for n in wrt if input_grads[n].n_contrib == 0]
    out_params = []
    for out in d.returns:
        rank = grads[current[out]].rank
        t = checked.tensors[out].dtype
        t = t if is_float(t) else dtype     # a non-float output's gradient is never read
        dims = ",".join(f"D_{out}_{k}" for k in range(rank))
        out_params.append(f"{t}({dims}) d_{out}" if rank else f"{t} d_{out}")
    sig_in = [_param_text(p) for p in d.params] + out_params
    body = lines + back
    # Forward statements no adjoint reads are dropped by the scheduler anyway, but they would
    # still be computed: keep only those the backward statements (transitively) read.
    body = _live(body)
    name = f"{entry}_grad"
    text = (f"def {name}({', '.join(sig_in)}) -> ({', '.join('d_' + n for n in wrt)}) {{\n"
            + "".join(f"    {ln}\n" for ln in body) + "}\n")
    return BackwardTc(text, name, wrt, tuple(d.returns))


class _Box:
    """The forward's concrete index ranges (``Ranges``) as ``where`` text, or nothing."""

    def __init__(self, ranges: Any, d: A.Def):
        self.ranges = ranges
        self.origins = dict(ranges.origins) if ranges is not None else {}

    def __bool__(self) -> bool:
        return self.ranges is not None

    def covers(self, k: int, subs: Sequence[str], tensor: str) -> bool:
        """Does an adjoint written at ``subs`` by statement ``k`` cover all of input ``tensor``
        (distinct indices, each over its whole dimension; fresh ``_g`` ones always are)?
        Shape-generic (no ranges): unknown, so the adjoint starts as zeros over the input."""
        if self.ranges is None:
            return all(x.startswith("_g") for x in subs)
        if len(set(subs)) != len(subs):
            return False
        r, shape = self.ranges.stmt_ranges[k], self.ranges.shapes[tensor]
        return all(x.startswith("_g") or r.get(x) == (0, n) for x, n in zip(subs, shape))

    def stmt(self, k: int, s: A.Stmt, names: Sequence[str]) -> str:
        """``v in lo:hi`` for the variables ``names`` of statement ``k`` (those the statement's
        own ``where`` does not already fix)."""
        fixed = {w.var for w in s.where}
        r = self.ranges.stmt_ranges[k]
        return ", ".join(f"{v} in {r[v][0]}:{r[v][1]}" for v in dict.fromkeys(names)
                         if v not in fixed)


def _join_where(where: str, extra: str) -> str:
    """`` where a, b`` with ``extra`` (comma-separated ranges, possibly empty) appended."""
    if not extra:
        return where
    return (where + ", " + extra) if where else " where " + extra


def _param_text(p: A.Param) -> str:
    if p.is_scalar:
        return f"{p.dtype} {p.name}"
    return f"{p.dtype}({','.join(str(x) for x in p.dims)}) {p.name}"


def _where(s: A.Stmt, rn: Callable, ranges_only: Sequence[str] | None = None) -> str:
    """The statement's ``where`` clause (ranges and ``exists``), tensors renamed; with
    ``ranges_only``, just the ranges of those indices."""
    rename = lambda n: rn(n, n)  # noqa: E731
    parts = [f"{w.var} in {_text(w.lo, rename)}:{_text(w.hi, rename)}" for w in s.where
             if ranges_only is None or w.var in ranges_only]
    if ranges_only is None:
        parts += [f"exists {_text(e, rename)}" for e in s.exists]
    return " where " + ", ".join(parts) if parts else ""


def _subscripts(acc: A.Call, rename: Callable[[str], str], size_of, tensor: str
                ) -> tuple[list[str], str | None, str]:
    """Left-hand indices for the adjoint of ``acc`` plus a one-hot factor and ``where`` ranges.

    Distinct plain indices are used as they are.  Any other subscript (``h + kh``, a constant,
    ``I(b,l)``, a repeated index) gets a fresh index ``_g<k>`` over the whole dimension and the
    factor ``(_g<k> == subscript ? 1 : 0)``: exact, at the price of a loop over that dimension.
    """
    subs, conds, ranges = [], [], []
    for k, a in enumerate(acc.args):
        if isinstance(a, A.Ident) and a.name not in subs:
            subs.append(a.name)
            continue
        g = f"_g{k}"
        subs.append(g)
        conds.append(f"{g} == {_text(a, rename)}")
        ranges.append(f"{g} in 0:{size_of(tensor, k)}")
    factor = _select(" && ".join(conds)) if conds else None
    return subs, factor, ", ".join(ranges)


def _range_for(subs: list[str], text: str, s: A.Stmt, tensor: str, size_of) -> str:
    """``where`` ranges for the indices ``subs`` of ``tensor`` that no access in ``text`` (or in
    the statement's ``where exists``) bounds."""
    used = {w.var for w in s.where}
    for e in (parse_expr(text), *s.exists):
        for x in A.walk(e):
            if isinstance(x, A.Call) and x.name not in BUILTINS and canonical(x.name) is None:
                used |= {y.name for a in x.args for y in A.walk(a) if isinstance(y, A.Ident)}
    return ", ".join(f"{i} in 0:{size_of(tensor, k)}"
                     for k, i in enumerate(subs) if i not in used)


def _sizer(params: dict, writer: dict, versions: list, rename_text: Callable
           ) -> Callable[[str, int], str]:
    """``size_of(tensor_version, k)``: dimension ``k``'s size as a TC expression of the signature.

    An input's size is in its declaration; a written tensor's (all its versions share it) is
    traced through any statement that writes it to a declared size (a ``where`` bound, or an
    access that bounds the index), with ``name.k`` as the last resort.
    """
    tensor_of = {v.name: v.tensor for v in versions}
    by_tensor: dict[str, list] = {}
    for v in versions:
        by_tensor.setdefault(v.tensor, []).append(writer[v.name])

    def size_of(name: str, k: int, seen: frozenset = frozenset()) -> str | None:
        if name in params:
            return str(params[name].dims[k])
        tensor = tensor_of.get(name, name)
        if (tensor, k) in seen:
            return None
        seen = seen | {(tensor, k)}
        for s, rd in by_tensor.get(tensor, []):
            var = s.lhs_indices[k]
            for w in s.where:
                if w.var == var:
                    return rename_text(w.hi, rd)
            for e in A.walk(s.rhs):
                if isinstance(e, A.Call) and e.name in rd:
                    for j, a in enumerate(e.args):
                        if isinstance(a, A.Ident) and a.name == var:
                            found = size_of(rd[e.name], j, seen)
                            if found is not None:
                                return found
        return None

    return lambda name, k: size_of(name, k) or f"{name}.{k}"


def _accumulate(target: _Version, subs: list[str], contrib: str, where: str) -> str:
    if target.grad is None:
        target.grad = f"d_{target.name}"
    op = "+=!" if target.n_contrib == 0 else "+="
    target.n_contrib += 1
    return f"{target.grad}({','.join(subs)}) {op} {contrib}{where}"


def _live(lines: list[str]) -> list[str]:
    """Drop forward statements whose tensor no later statement reads (backward ones stay)."""
    keep = [True] * len(lines)
    needed: set[str] = set()
    for k in range(len(lines) - 1, -1, -1):
        lhs = lines[k].split("(", 1)[0]
        names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", lines[k].split(")", 1)[1]))
        if lhs.startswith("d_") or lhs in needed:
            needed |= names
        else:
            keep[k] = False
    return [ln for ln, k in zip(lines, keep) if k]

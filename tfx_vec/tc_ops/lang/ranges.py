"""Range inference (§3.1) evaluated for concrete sizes, plus the static bounds check.

The *plan* (which access resolves which index in which round) is computed once by ``lang.sema``;
``infer_ranges`` replays it for the sizes of actual inputs: each round gives every index resolved
in it the largest interval keeping each of its accesses in bounds for *all* values of the indices
resolved before (universal quantification, as in Halide), intersected over the accesses; indices
start at 0 unless a ``where`` clause says otherwise.  Then every subscript of every access is
checked against its tensor's extent by interval arithmetic; data-dependent subscripts use the value
range of the index tensor (``value_ranges``); a read guarded by a condition (``c ? A(i - 1) : 0``)
is checked only over the points where the condition can hold.

A tensor a TC defines gets the box of its first defining statement: its shape is the extent of
each left index's range and its origin the range's start (``O(i) = I(i - 1)`` ranges ``i`` over
``[1, N]``, so ``O`` has ``N`` elements and ``O(i)`` is element ``i - 1``), as the original sizes
outputs (``tc2halide``: bounds ``min`` and ``max - min + 1``).

Example:
    >>> from tfx_vec.tc_ops.lang.parser import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> d = check(parse("def conv1d(float(M) I, float(N) K) -> (O) "
    ...                 "{ O(i) +=! K(x) * I(i + x) }").defs[0])
    >>> r = infer_ranges(d, {"I": (10,), "K": (3,)})
    >>> r.stmt_ranges[0], r.shapes["O"]
    ({'i': (0, 8), 'x': (0, 3)}, (8,))
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ..errors import TcRangeError, TcShapeError
from . import ast as A
from .printer import expr_to_tc
from .sema import CheckedDef, linear_in
from .types import canonical

__all__ = ["Ranges", "infer_ranges", "interval", "check_values", "refine"]

Interval = tuple  # (lo, hi) inclusive integers


@dataclasses.dataclass(frozen=True)
class Ranges:
    """Concrete sizes: size parameters, every tensor's shape, each statement's index ranges
    (``{var: (lo, hi)}``, half-open), and the accesses whose data-dependent subscripts must be
    clamped in generated code because their index values are not known before the kernel runs.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> d = check_program("def f(float(N) A) -> (B) { B(i) = A(i + 5) where i in -5:0 }")["f"]
        >>> r = infer_ranges(d, {"A": (5,)})
        >>> r.shapes["B"], r.stmt_ranges[0], r.origin("B")
        ((5,), {'i': (-5, 0)}, (-5,))
    """

    sizes: dict
    shapes: dict
    stmt_ranges: tuple
    clamp: frozenset       # ids of Call nodes (reads) needing clamped subscripts
    value_checks: tuple = ()   # (constraint, env) of subscripts indexed by input values
    origins: dict = dataclasses.field(default_factory=dict)  # tensor -> first index per dim

    def origin(self, name: str) -> tuple[int, ...]:
        """The index of each dimension's first element (0 unless the tensor's defining
        statement ranges its index from elsewhere)."""
        return self.origins.get(name) or (0,) * len(self.shapes[name])

    def key(self) -> tuple:
        return (tuple(sorted(self.sizes.items())), tuple(sorted(self.shapes.items())),
                tuple(tuple(sorted(r.items())) for r in self.stmt_ranges),
                tuple(sorted(self.origins.items())))


def bind_sizes(d: CheckedDef, shapes: Mapping[str, tuple]) -> dict:
    """Size parameter values from input shapes; raises TcShapeError on a rank or size clash."""
    sizes: dict[str, int] = {}
    where_from: dict[str, str] = {}
    for p in d.inputs:
        if p.is_scalar:
            continue
        shape = tuple(int(x) for x in shapes[p.name])
        if len(shape) != len(p.dims):
            raise TcShapeError(f"{d.name}: input {p.name} is declared "
                               f"{p.dtype}({', '.join(map(str, p.dims))}) (rank {len(p.dims)}) "
                               f"but got shape {shape} (rank {len(shape)})")
        for k, (dim, n) in enumerate(zip(p.dims, shape)):
            if isinstance(dim, int):
                if dim != n:
                    raise TcShapeError(f"{d.name}: dimension {k} of {p.name} is declared {dim} "
                                       f"but has size {n}")
            elif dim in sizes and sizes[dim] != n:
                raise TcShapeError(f"{d.name}: size {dim} is {sizes[dim]} from {where_from[dim]} "
                                   f"but {n} from dimension {k} of {p.name} {shape}")
            else:
                sizes.setdefault(dim, n)
                where_from.setdefault(dim, f"{p.name} {shape}")
    return sizes


def interval(e: A.Expr, env: Mapping[str, Interval], shapes: Mapping[str, tuple],
             values: Mapping[str, Interval] | None = None) -> Interval | None:
    """Integer interval of ``e`` given intervals of names; None if unknown (e.g. a read of a
    tensor whose value range is not in ``values``, or a non-integer operation).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> interval(parse_expr("i + 2*j"), {"i": (0, 3), "j": (1, 2)}, {})
        (2, 7)
    """
    rec = lambda x: interval(x, env, shapes, values)  # noqa: E731
    if isinstance(e, A.IntLit):
        return (e.value, e.value)
    if isinstance(e, A.Ident):
        return env.get(e.name)
    if isinstance(e, A.DimRef):
        if e.name not in shapes:      # a tensor no earlier statement has sized
            return None
        n = shapes[e.name][e.dim]
        return (n, n)
    if isinstance(e, A.Unary):
        a = rec(e.operand)
        if a is None or e.op == "!":
            return None
        return a if e.op == "+" else (-a[1], -a[0])
    if isinstance(e, A.Binary):
        a, b = rec(e.lhs), rec(e.rhs)
        if a is None or b is None:
            return None
        if e.op == "+":
            return (a[0] + b[0], a[1] + b[1])
        if e.op == "-":
            return (a[0] - b[1], a[1] - b[0])
        if e.op == "*":
            ps = [x * y for x in a for y in b]
            return (min(ps), max(ps))
        if e.op in ("/", "%") and b[0] == b[1] and b[0] > 0:
            k = b[0]
            if e.op == "/":
                return (_cdiv(a[0], k), _cdiv(a[1], k))
            if a[0] >= 0 and a[1] - a[0] + 1 < k and a[0] % k <= a[1] % k:
                return (a[0] % k, a[1] % k)
            return (0 if a[0] >= 0 else -(k - 1), k - 1)
        if e.op == "%" and b[0] > 0:      # a divisor ranging over positive values
            top = b[1] - 1
            return (0, min(a[1], top)) if a[0] >= 0 else (-top, top)
        return None
    if isinstance(e, A.Ternary):
        a, b = rec(e.then), rec(e.other)
        if a is None or b is None:
            return None
        return (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, A.Call):
        if canonical(e.name) is not None and len(e.args) == 1 and \
                canonical(e.name) not in ("half", "float", "double"):
            return rec(e.args[0])        # an integer cast keeps an integer's value
        if e.name in ("min", "max") and len(e.args) == 2:
            a, b = rec(e.args[0]), rec(e.args[1])
            if a is None or b is None:
                return None
            f = min if e.name == "min" else max
            return (f(a[0], b[0]), f(a[1], b[1]))
        if values is not None and e.name in values:
            return values[e.name]
        return None
    return None


def _cdiv(a: int, b: int) -> int:
    """C's truncating division."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _floordiv(a: int, b: int) -> int:
    return a // b


def _ceildiv(a: int, b: int) -> int:
    return -((-a) // b)


def infer_ranges(d: CheckedDef, shapes: Mapping[str, tuple],
                 scalars: Mapping[str, int] | None = None,
                 value_ranges: Mapping[str, Interval] | None = None) -> Ranges:
    """Sizes, shapes and index ranges of ``d`` for inputs of the given ``shapes``.

    Args:
        shapes: input tensor name -> shape.
        scalars: values of the integer scalar arguments used in subscripts or where clauses.
        value_ranges: (min, max) of the values of input tensors used as subscripts.

    Raises:
        TcShapeError: inputs disagree with the signature.
        TcRangeError: an index gets an empty range, or an access may leave its tensor.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")
        >>> r = infer_ranges(d["mm"], {"A": (2, 3), "B": (3, 4)})
        >>> r.sizes, r.shapes["C"]
        ({'M': 2, 'K': 3, 'N': 4}, (2, 4))
    """
    sizes = bind_sizes(d, shapes)
    scalars = dict(scalars or {})
    for s in d.structural_scalars:
        if s not in scalars:
            raise TcShapeError(f"{d.name}: the value of scalar {s!r} is needed at compile time")
    all_shapes = {p.name: tuple(int(x) for x in shapes[p.name]) for p in d.inputs
                  if not p.is_scalar}
    origins = {n: (0,) * len(sh) for n, sh in all_shapes.items()}
    base_env = {k: (v, v) for k, v in {**sizes, **scalars}.items()}
    stmt_ranges: dict[int, dict] = {}
    envs: dict[int, dict] = {}
    clamp = set()
    err = lambda msg, sp: TcRangeError(f"in def {d.name}: {msg}", sp,  # noqa: E731
                                       d.source or None)
    for cs in (d.stmts[k] for k in d.plan_order):
        s = cs.stmt
        env = dict(base_env)
        ranges: dict[str, tuple[int, int]] = {}
        for v, rc in cs.where.items():
            lo, hi = interval(rc.lo, env, all_shapes), interval(rc.hi, env, all_shapes)
            if lo is None or hi is None or lo[0] != lo[1] or hi[0] != hi[1]:
                raise err(f"where-clause bounds of {v!r} are not integer constants", rc.span)
            ranges[v] = (lo[0], hi[0])
            env[v] = (lo[0], hi[0] - 1)
        for rnd in cs.rounds:
            resolved = {}
            for v, constraints in rnd:
                lo, hi = None, None      # the range the accesses allow (may start below 0)
                for c in constraints:
                    coef, rest = linear_in(c.expr, v, d.params)
                    a = interval(coef, env, all_shapes)
                    r = interval(rest, env, all_shapes)
                    if a is None or a[0] != a[1] or r is None:
                        raise err(f"cannot evaluate subscript {expr_to_tc(c.expr)} of "
                                  f"{c.tensor}", c.span)
                    a = a[0]
                    o = origins[c.tensor][c.dim]
                    n = all_shapes[c.tensor][c.dim]
                    if a == 0:
                        continue
                    if a > 0:   # o <= a*v + r <= o+n-1 for every r in [r0, r1]
                        clo, chi = _ceildiv(o - r[0], a), _floordiv(o + n - 1 - r[1], a)
                    else:
                        clo, chi = _ceildiv(o + n - 1 - r[1], a), _floordiv(o - r[0], a)
                    lo = clo if lo is None else max(lo, clo)
                    hi = chi if hi is None else min(hi, chi)
                if hi is None:
                    raise err(f"cannot infer the range of index {v!r}: its coefficient is 0",
                              constraints[0].span)
                if hi < lo:
                    dims = ", ".join(f"{k}={x}" for k, x in sizes.items())
                    raise err(f"index {v!r} gets an empty range [{lo}, {hi + 1}) for sizes "
                              f"{dims}", constraints[0].span)
                resolved[v] = (lo, hi + 1)
            for v, (lo, hi) in resolved.items():
                ranges[v] = (lo, hi)
                env[v] = (lo, hi - 1)
        for v, (lo, hi) in ranges.items():
            if hi <= lo:
                raise err(f"index {v!r} has an empty range [{lo}, {hi})",
                          cs.where[v].span if v in cs.where else s.span)
        ordered = {v: ranges[v] for v in cs.all_vars}
        stmt_ranges[cs.index] = ordered
        envs[cs.index] = env
        if s.lhs not in all_shapes:
            all_shapes[s.lhs] = tuple(ordered[v][1] - ordered[v][0] for v in s.lhs_indices)
            origins[s.lhs] = tuple(ordered[v][0] for v in s.lhs_indices)
            _check_declared(d, s, all_shapes[s.lhs], sizes)
    value_checks = []
    for cs in d.stmts:
        env = envs[cs.index]
        for c in cs.checks:
            inner = {x.name for x in A.walk(c.expr) if isinstance(x, A.Call) and
                     x.name in d.tensors}
            if inner and all(d.tensors[r].kind == "input" for r in inner):
                value_checks.append((c, env))     # index values known per call: check_values
                if value_ranges is None:
                    continue
            elif inner:
                clamp.update(id(x) for x in cs.reads if c.expr in x.args)
                continue
            _check_subscript(d, c, env, all_shapes, origins, value_ranges)
    return Ranges(sizes, all_shapes, tuple(stmt_ranges[k] for k in range(len(d.stmts))),
                  frozenset(clamp), tuple(value_checks),
                  {n: o for n, o in origins.items() if any(o)})


def _check_declared(d: CheckedDef, s: A.Stmt, shape: tuple, sizes: dict) -> None:
    """An output declared with sizes (``-> (int32(M,N) O)``) must get exactly those."""
    dims = d.tensors[s.lhs].dims
    if dims is None:
        return
    want = tuple(sizes[x] if isinstance(x, str) else x for x in dims)
    if want != shape:
        raise TcShapeError(f"in def {d.name}: output {s.lhs} is declared "
                           f"({', '.join(map(str, dims))}) = {want} but its statements "
                           f"define {shape}", s.span, d.source or None)


def refine(env: Mapping[str, Interval], guard: tuple, shapes: Mapping[str, tuple]
           ) -> dict | None:
    """``env`` narrowed to the points where every ``(condition, holds)`` of ``guard`` can hold
    (sound: only affine comparisons narrow, anything else leaves the intervals as they are);
    None when some index is left with no value (the guarded code never runs).

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> refine({"i": (0, 9)}, ((parse_expr("i - 1 >= 0"), True),), {})
        {'i': (1, 9)}
        >>> refine({"i": (0, 9)}, ((parse_expr("i > 20"), True),), {}) is None
        True
    """
    env = dict(env)
    for cond, op in _comparisons(guard):
        diff = A.Binary("-", cond.lhs, cond.rhs, cond.span)       # diff op 0
        consts = frozenset(x for x in env if env[x][0] == env[x][1])
        for v in [x for x in env if env[x][0] != env[x][1]]:
            if not any(isinstance(x, A.Ident) and x.name == v for x in A.walk(diff)):
                continue
            lin = linear_in(diff, v, consts)
            if lin is None:
                continue
            a = interval(lin[0], env, shapes)
            r = interval(lin[1], {k: x for k, x in env.items() if k != v}, shapes)
            if a is None or r is None or a[0] != a[1] or a[0] == 0:
                continue
            lo, hi = env[v]
            a = a[0]
            if op == "!=":      # a*v + r != 0 with r fixed: v is not -r/a (an end falls off)
                if r[0] == r[1] and -r[0] % a == 0:
                    x = -r[0] // a
                    lo, hi = lo + (x == lo), hi - (x == hi)
            # a*v + r op 0 holds for some r in [r0, r1] only if a*v op -r for the extreme r
            for o in ((">=", "<=") if op == "==" else () if op == "!=" else (op,)):
                strict = o in (">", "<")
                if o in (">", ">="):                 # a*v >= t
                    t = -r[1] + strict
                    lo, hi = (max(lo, _ceildiv(t, a)), hi) if a > 0 else \
                        (lo, min(hi, _floordiv(t, a)))
                else:                                # a*v <= t
                    t = -r[0] - strict
                    lo, hi = (lo, min(hi, _floordiv(t, a))) if a > 0 else \
                        (max(lo, _ceildiv(t, a)), hi)
            if lo > hi:
                return None
            env[v] = (lo, hi)
    return env


_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _comparisons(guard: tuple):
    """The comparisons a guard's ``(condition, holds)`` pairs establish, as ``(comparison,
    operator that holds)``: through ``!``, and into both sides of an ``&&`` that holds or an
    ``||`` that fails (any other condition establishes nothing usable: sound to skip)."""
    todo = list(guard)
    while todo:
        cond, holds = todo.pop()
        if isinstance(cond, A.Unary) and cond.op == "!":
            todo.append((cond.operand, not holds))
        elif isinstance(cond, A.Binary) and cond.op in ("&&", "||"):
            if (cond.op == "&&") == holds:
                todo += [(cond.lhs, holds), (cond.rhs, holds)]
        elif isinstance(cond, A.Binary) and cond.op in _NEGATE:
            yield cond, (cond.op if holds else _NEGATE[cond.op])


def _linear_form(e: A.Expr, env: Mapping[str, Interval], shapes, atoms: dict
                 ) -> tuple[dict, int] | None:
    """``e`` as ({term: coefficient}, constant) when it is affine in its terms, else None.

    Terms are the indices of ``env`` with non-constant intervals and reads of tensors (named
    by their text, collected in ``atoms`` with the read); sizes and scalars fold into the
    constant."""
    if isinstance(e, A.Ident) and e.name in env and env[e.name][0] != env[e.name][1]:
        return {e.name: 1}, 0
    if isinstance(e, A.Call) and not (e.name in ("min", "max") or canonical(e.name)):
        key = expr_to_tc(e)
        atoms[key] = e
        return {key: 1}, 0
    if not any(isinstance(x, (A.Call, A.Ident)) and (isinstance(x, A.Call) or (
            x.name in env and env[x.name][0] != env[x.name][1])) for x in A.walk(e)):
        iv = interval(e, env, shapes)
        return ({}, iv[0]) if iv is not None and iv[0] == iv[1] else None
    if isinstance(e, A.Unary) and e.op in "+-":
        f = _linear_form(e.operand, env, shapes, atoms)
        return f if f is None or e.op == "+" else ({k: -v for k, v in f[0].items()}, -f[1])
    if isinstance(e, A.Binary) and e.op in "+-":
        a = _linear_form(e.lhs, env, shapes, atoms)
        b = _linear_form(e.rhs, env, shapes, atoms)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "+" else -1
        coefs = dict(a[0])
        for k, v in b[0].items():
            coefs[k] = coefs.get(k, 0) + sign * v
        return {k: v for k, v in coefs.items() if v}, a[1] + sign * b[1]
    if isinstance(e, A.Binary) and e.op == "*":
        a = _linear_form(e.lhs, env, shapes, atoms)
        b = _linear_form(e.rhs, env, shapes, atoms)
        if a is None or b is None or (a[0] and b[0]):
            return None
        (f, k) = (a, b[1]) if not b[0] else (b, a[1])
        return {x: v * k for x, v in f[0].items() if v * k}, f[1] * k
    return None


def _guard_bounds(expr: A.Expr, guard: tuple, env, shapes, values=None
                  ) -> tuple[float, float]:
    """Bounds on ``expr`` from the guard's affine comparisons: with ``expr = s * diff + rest``
    for a guard ``diff op 0``, ``expr`` is bounded by ``op`` and the interval of ``rest``
    (``t - k >= 0`` bounds the subscript ``t - k`` from below; ``!(Idx(k) + l >= Idx(k + 1))``
    bounds ``Idx(k) + l`` by the values of ``Idx``)."""
    lo, hi = -float("inf"), float("inf")
    atoms: dict = {}
    target = _linear_form(expr, env, shapes, atoms)
    if target is None or not target[0]:
        return lo, hi

    def term_interval(k: str) -> Interval | None:
        if k in atoms:
            return interval(atoms[k], env, shapes, values)
        return env.get(k)

    for cond, op in _comparisons(guard):
        diff = _linear_form(A.Binary("-", cond.lhs, cond.rhs, cond.span), env, shapes, atoms)
        if diff is None or not diff[0] or op == "!=":
            continue
        for sign in (1, -1):
            rest = dict(target[0])
            for k, v in diff[0].items():
                rest[k] = rest.get(k, 0) - sign * v
            rest = {k: v for k, v in rest.items() if v}
            r_lo = r_hi = target[1] - sign * diff[1]
            for k, v in rest.items():
                iv = term_interval(k)
                if iv is None:
                    break
                r_lo += min(v * iv[0], v * iv[1])
                r_hi += max(v * iv[0], v * iv[1])
            else:
                # expr = sign * diff + rest, diff op 0
                for o in ((">=", "<=") if op == "==" else (op,)):
                    if o == "!=":
                        continue
                    strict = o in (">", "<")
                    if (o in (">", ">=")) == (sign > 0):
                        lo = max(lo, r_lo + strict)
                    else:
                        hi = min(hi, r_hi - strict)
    return lo, hi


def _check_subscript(d: CheckedDef, c, env, shapes, origins, values) -> None:
    if c.guard:
        gl, gh = _guard_bounds(c.expr, c.guard, env, shapes, values)
        env = refine(env, c.guard, shapes)
        if env is None or gl > gh:
            return
    n = shapes[c.tensor][c.dim]
    o = origins.get(c.tensor, (0,) * len(shapes[c.tensor]))[c.dim]
    iv = interval(c.expr, env, shapes, values)
    if iv is not None and c.guard:
        iv = (max(iv[0], gl), min(iv[1], gh))
        if iv[0] > iv[1]:
            return
    if iv is None:
        raise TcRangeError(f"in def {d.name}: cannot bound subscript {expr_to_tc(c.expr)} of "
                           f"{c.tensor}", c.span, d.source or None)
    if iv[0] < o or iv[1] > o + n - 1:
        where = f"has size {n}" if o == 0 else f"ranges over [{o}, {o + n - 1}]"
        raise TcRangeError(f"in def {d.name}: subscript {expr_to_tc(c.expr)} of {c.tensor} "
                           f"ranges over [{iv[0]}, {iv[1]}] but dimension {c.dim} of {c.tensor} "
                           f"{where}", c.span, d.source or None)


def check_values(d: CheckedDef, ranges: Ranges, values: Mapping[str, Interval]) -> None:
    """Check the data-dependent subscripts whose index tensors are inputs, given the (min, max)
    of those inputs' values (cheap: run per call, after the shape-keyed inference is cached).

    Raises:
        TcRangeError: an index value would read outside its tensor.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> d = check_program("def g(float(E) T, int32(N) I) -> (O) { O(n) = T(I(n)) }")["g"]
        >>> r = infer_ranges(d, {"T": (5,), "I": (3,)})
        >>> check_values(d, r, {"I": (0, 4)})      # every index value inside T: fine
        >>> check_values(d, r, {"I": (0, 5)})
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcRangeError: line 1, column 49: in def g: subscript I(n) of T ranges over [0, 5] ...
        ...
    """
    for c, env in ranges.value_checks:
        _check_subscript(d, c, env, ranges.shapes, ranges.origins, values)

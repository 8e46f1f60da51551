"""The definitional interpreter of a checked TC: NumPy, statement by statement, no scheduling.

It *defines* what a TC computes (§3): each statement evaluates its right side over the whole
iteration box (read in full before writing), reduces over the reduction indices with the
statement's operator, and writes the left side; ``!`` forms start from the neutral element.
Arithmetic follows the generated C (element types from ``lang.sema``, truncating integer
division, ``x / 0 == 0`` for integers).  Backends are tested against it on random programs.

Example:
    >>> import numpy as np
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> d = check(parse("def mv(float(M,K) A, float(K) x) -> (C) "
    ...                 "{ C(i) +=! A(i,k) * x(k) }").defs[0])
    >>> interpret(d, [np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)])[0].tolist()
    [3.0, 3.0]
"""
from __future__ import annotations

import numpy as np

from . import ast as A
from .ranges import infer_ranges
from .sema import CheckedDef
from .types import canonical, is_float, np_dtype

__all__ = ["interpret"]

_UNARY = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt, "sin": np.sin,
          "cos": np.cos, "tan": np.tan, "log1p": np.log1p, "expm1": np.expm1,
          "floor": np.floor, "ceil": np.ceil, "round": np.round, "log2": np.log2,
          "exp2": np.exp2, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
          "sinh": np.sinh, "cosh": np.cosh, "cbrt": np.cbrt, "fabs": np.abs, "abs": np.abs,
          "rsqrt": lambda x: 1 / np.sqrt(x), "sigmoid": lambda x: 1 / (1 + np.exp(-x))}
_BINARY = {"fmax": np.fmax, "fmin": np.fmin, "max": np.maximum, "min": np.minimum,
           "pow": np.power, "atan2": np.arctan2, "fmod": np.fmod, "nextafter": np.nextafter,
           "hypot": np.hypot, "copysign": np.copysign}
_REDUCE = {"+=": np.add, "*=": np.multiply, "min=": np.minimum, "max=": np.maximum}


def _neutral(op: str, dtype: np.dtype):
    if op == "+=":
        return 0
    if op == "*=":
        return 1
    if dtype.kind == "f":
        return np.inf if op == "min=" else -np.inf
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is None:
        return op == "min="
    return info.max if op == "min=" else info.min


def interpret(d: CheckedDef, inputs: list, scalars: dict | None = None,
              outputs: list | None = None) -> tuple:
    """Outputs of ``d`` on ``inputs`` (NumPy arrays / scalars in signature order).

    ``outputs`` gives the outputs' initial contents (default zeros): what a reduction without
    ``!`` into a not yet written output reduces into.

    Example:
        >>> import numpy as np
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> d = check_program("def f(float(N,K) A) -> (B) { B(n) +=! A(n,k) }")["f"]
        >>> interpret(d, [np.ones((2, 3), np.float32)])
        (array([3., 3.], dtype=float32),)
    """
    args = {p.name: (np.asarray(x, np_dtype(p.dtype)) if p.is_scalar else np.asarray(x))
            for p, x in zip(d.inputs, inputs)}
    shapes = {p.name: args[p.name].shape for p in d.inputs if not p.is_scalar}
    structural = {s: int(args[s]) for s in d.structural_scalars}
    ranges = infer_ranges(d, shapes, structural, {
        n: (int(a.min()), int(a.max())) if a.size and a.dtype.kind in "iu" else (0, 0)
        for n, a in args.items() if n in d.tensors})
    env = dict(args)
    for name, info in d.tensors.items():
        if info.kind != "input":
            env[name] = np.zeros(ranges.shapes[name], np_dtype(info.dtype))
    for name, init in zip(d.outputs, outputs or ()):
        env[name][...] = init
    for cs, box in zip(d.stmts, ranges.stmt_ranges):
        s = cs.stmt
        names = list(cs.all_vars)
        grids = np.meshgrid(*[np.arange(lo, hi) for lo, hi in (box[v] for v in names)],
                            indexing="ij") if names else []
        idx = dict(zip(names, grids))
        out = env[s.lhs]
        dt = out.dtype
        with np.errstate(all="ignore"):
            val = np.asarray(_eval(d, s.rhs, idx, env, ranges)).astype(dt)
        val = np.broadcast_to(val, grids[0].shape if grids else ())
        nl = len(cs.lhs_vars)
        lhs_at = tuple(np.arange(box[v][0], box[v][1]) - o
                       for v, o in zip(cs.lhs_vars, ranges.origin(s.lhs)))
        sel = np.ix_(*lhs_at) if nl else ()
        if s.op == "=":
            new = val
        else:
            red = tuple(range(nl, len(names)))
            part = _REDUCE[s.op].reduce(val, axis=red) if red else val
            start = np.full(part.shape, _neutral(s.op, dt), dt) if s.init else out[sel]
            new = _REDUCE[s.op](start, part)
        out[sel] = np.asarray(new).astype(dt)
    return tuple(env[n] for n in d.outputs)


def _idiv(a, b, op):
    a, b = np.asarray(a), np.asarray(b)
    safe = np.where(b == 0, 1, b)
    q = np.sign(a) * np.sign(safe) * (np.abs(a) // np.abs(safe))
    if op == "/":
        return np.where(b == 0, 0, q).astype(np.result_type(a, b))
    return np.where((b == 0) | (b == -1), 0, a - q * safe).astype(np.result_type(a, b))


def _eval(d: CheckedDef, e: A.Expr, idx: dict, env: dict, ranges):
    rec = lambda x: _eval(d, x, idx, env, ranges)  # noqa: E731
    t = d.types.get(id(e))
    cast = (lambda v: np.asarray(v).astype(np_dtype(t))) if t else (lambda v: v)
    if isinstance(e, A.IntLit):
        return cast(e.value)
    if isinstance(e, A.FloatLit):
        return cast(e.value)
    if isinstance(e, A.Ident):
        if e.name in idx:
            return idx[e.name].astype(np.int32)
        if e.name in ranges.sizes:
            return np.int32(ranges.sizes[e.name])
        return env[e.name]
    if isinstance(e, A.DimRef):
        return np.int32(ranges.shapes[e.name][e.dim])
    if isinstance(e, A.Unary):
        v = rec(e.operand)
        return cast(np.logical_not(v) if e.op == "!" else (-v if e.op == "-" else v))
    if isinstance(e, A.Binary):
        a, b = rec(e.lhs), rec(e.rhs)
        if e.op in ("/", "%") and not is_float(t):
            return cast(_idiv(cast(a), cast(b), e.op))
        ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
               "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
               ">": np.greater, ">=": np.greater_equal, "&&": np.logical_and,
               "||": np.logical_or}
        if e.op in ("==", "!=", "<", "<=", ">", ">=", "&&", "||"):
            return ops[e.op](a, b)
        return cast(ops[e.op](cast(a), cast(b)))
    if isinstance(e, A.Ternary):
        return cast(np.where(rec(e.cond), rec(e.then), rec(e.other)))
    if isinstance(e, A.Call):
        if e.name in d.tensors:
            subs = []
            for k, (a, o) in enumerate(zip(e.args, ranges.origin(e.name))):
                v = np.asarray(rec(a)).astype(np.int64) - o
                # in range wherever the read is evaluated (checked, or clamped when computed
                # ids are used); clipping only touches the lanes a guard (c ? A(i-1) : 0)
                # discards, which NumPy evaluates too
                subs.append(np.clip(v, 0, ranges.shapes[e.name][k] - 1))
            arr = env[e.name]
            return arr[tuple(subs)] if subs else arr[()]
        args = [rec(a) for a in e.args]
        if canonical(e.name) is not None:
            return cast(args[0])
        base = e.name[:-1] if e.name.endswith("f") and e.name[:-1] in (
            set(_UNARY) | set(_BINARY)) else e.name
        if base in _UNARY:
            return cast(_UNARY[base](cast(args[0])))
        return cast(_BINARY[base](cast(args[0]), cast(args[1])))
    raise TypeError(e)  # pragma: no cover

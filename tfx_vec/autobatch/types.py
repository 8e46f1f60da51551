"""Values and types: running primitives on batches, and abstract evaluation of a program.

A variable's *type* is a structure (nested tuples/namedtuples) of :class:`tf.TensorSpec` whose
leading dimension is the batch size.  :func:`infer_types` finds one for every variable of every
function by tracing each primitive with ``tf.function(...).get_concrete_function(specs)``
(no user annotations), propagating through calls to a fixed point, so recursion works as soon
as one path (the base case) gives the function's result a type.

Rank-0 results of a primitive (Python constants such as ``return 1``) are broadcast to the batch.

Example:
    >>> import tensorflow as tf
    >>> spec_of((tf.zeros([4, 2]), tf.zeros([4], tf.int32)))[1]
    TensorSpec(shape=(4,), dtype=tf.int32, name=None)
"""
from __future__ import annotations

import linecache
from typing import Any, Mapping, Sequence

import tensorflow as tf

from . import ir
from .errors import AutobatchError, PrimitiveError, TypeInferenceError

__all__ = ["run_primitive", "select", "spec_of", "infer_types", "format_spec", "zeros_of"]


def _batched_leaf(x: Any, batch_size: Any) -> tf.Tensor:
    x = tf.convert_to_tensor(x)
    if x.shape.rank == 0:
        return tf.broadcast_to(x, tf.reshape(batch_size, [1]))
    return x


@tf.autograph.experimental.do_not_convert
def run_primitive(prim: ir.Primitive, values: Sequence[Any], batch_size: Any) -> tuple:
    """Run ``prim`` on whole-batch ``values``; rank-0 results are broadcast to the batch."""
    try:
        outs = prim.fn(*values)
        return tuple(tf.nest.map_structure(lambda x: _batched_leaf(x, batch_size), o)
                     for o in outs)
    except AutobatchError:
        raise
    except Exception as e:
        raise PrimitiveError(f"{_failing_line(prim, e)} failed: {type(e).__name__}: {e}") from e


def _failing_line(prim: ir.Primitive, e: BaseException) -> str:
    """``file:line: `source``` of the user statement that raised (primitives are compiled with
    the user's file name and line numbers)."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_ab_prim":
            line = tb.tb_lineno
        tb = tb.tb_next
    filename = prim.loc.rsplit(":", 1)[0]
    text = linecache.getline(filename, line).strip() if line else ""
    if not text:
        return f"{prim.loc}: `{prim.text}`"
    return f"{filename}:{line}: `{text}`"


def select(mask: tf.Tensor, new: Any, old: Any, what: str = "") -> Any:
    """Per member: ``new`` where ``mask`` else ``old`` (structures of batched tensors)."""
    def leaf(n, o):
        n = tf.convert_to_tensor(n)
        return tf.where(tf.reshape(mask, [-1] + [1] * (n.shape.rank - 1)), n, o)
    try:
        return tf.nest.map_structure(leaf, new, old)
    except (ValueError, TypeError) as e:
        raise TypeInferenceError(f"{what}: a new value does not match the variable's earlier "
                                 f"structure/dtype/shape: {e}") from e


def spec_of(value: Any) -> Any:
    """The structure of TensorSpecs describing ``value``."""
    return tf.nest.map_structure(
        lambda x: tf.TensorSpec(tf.convert_to_tensor(x).shape, tf.convert_to_tensor(x).dtype),
        value)


def zeros_of(spec: Any, leading: Sequence[int] = ()) -> Any:
    """Zeros of a type, with extra ``leading`` dimensions (e.g. a stack depth)."""
    return tf.nest.map_structure(lambda s: tf.zeros(list(leading) + s.shape.as_list(), s.dtype),
                                 spec)


def format_spec(spec: Any) -> str:
    def one(s):
        return f"{s.dtype.name}{s.shape.as_list()}"
    if isinstance(spec, tf.TensorSpec):
        return one(spec)
    return str(tf.nest.pack_sequence_as(spec, [one(s) for s in tf.nest.flatten(spec)])
               ).replace("'", "")


def _same(a: Any, b: Any) -> bool:
    try:
        tf.nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    return all(x.dtype == y.dtype and x.shape == y.shape
               for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))


class _Inference:
    def __init__(self, program: ir.Program, batch_size: int):
        self.program, self.batch_size = program, batch_size
        self.env: dict[str, dict[str, Any]] = {name: {} for name in program.functions}
        self.cache: dict[tuple, tuple] = {}
        self.changed = False

    def merge(self, fname: str, var: str, spec: Any, loc: str) -> None:
        env = self.env[fname]
        for s in tf.nest.flatten(spec):
            if not s.shape.is_fully_defined() or s.shape.rank == 0 or \
                    s.shape[0] != self.batch_size:
                raise TypeInferenceError(
                    f"{loc}: variable {var!r} of {fname} gets {format_spec(spec)}: every value "
                    f"must have a static shape with leading (batch) dimension {self.batch_size}")
        if var not in env:
            env[var] = spec
            self.changed = True
        elif not _same(env[var], spec):
            raise TypeInferenceError(
                f"{loc}: variable {var!r} of {fname} is {format_spec(env[var])} in one place "
                f"and {format_spec(spec)} here; a variable must keep one structure, dtype and "
                "shape")

    def primitive(self, fname: str, prim: ir.Primitive) -> None:
        env = self.env[fname]
        if not all(v in env for v in prim.inputs):
            return
        specs = tuple(env[v] for v in prim.inputs)
        key = (id(prim), repr(specs))
        if key not in self.cache:
            batch = self.batch_size
            traced = tf.function(lambda *a: run_primitive(prim, a, batch), autograph=False)
            outs = traced.get_concrete_function(*specs).structured_outputs
            self.cache[key] = tuple(spec_of(o) for o in outs)
        for var, spec in zip(prim.outputs, self.cache[key]):
            self.merge(fname, var, spec, prim.loc)

    def call(self, fname: str, op: ir.Call) -> None:
        env, callee = self.env[fname], self.program.functions[op.callee]
        for p, a in zip(callee.params, op.args):
            if a in env:
                self.merge(op.callee, p, env[a], op.loc)
        if callee.result in self.env[op.callee]:
            self.merge(fname, op.output, self.env[op.callee][callee.result], op.loc)

    def run(self, arg_specs: Sequence[Any]) -> dict[str, dict[str, Any]]:
        main = self.program.functions[self.program.main]
        for p, s in zip(main.params, arg_specs):
            self.merge(main.name, p, s, main.loc)
        for _ in range(1000):
            self.changed = False
            for f in self.program.functions.values():
                for block in f.blocks:
                    for op in block.ops:
                        if isinstance(op, ir.Primitive):
                            self.primitive(f.name, op)
                        elif isinstance(op, ir.Call):
                            self.call(f.name, op)
            if not self.changed:
                break
        self.check()
        return self.env

    def check(self) -> None:
        for f in self.program.functions.values():
            env = self.env[f.name]
            if f.result not in env:
                raise TypeInferenceError(
                    f"{f.loc}: could not give the result of {f.name} a type: no path returns a "
                    "value computed without calling it (missing base case?) or it is never "
                    "called")
            for block in f.blocks:
                t = block.terminator
                if isinstance(t, ir.Branch):
                    s = env.get(t.cond)
                    if s is None or not isinstance(s, tf.TensorSpec) or s.dtype != tf.bool or \
                            s.shape.rank != 1:
                        raise TypeInferenceError(
                            f"{t.loc}: a condition must be one boolean per batch member, got "
                            f"{format_spec(s) if s is not None else 'no value'}")


def infer_types(program: ir.Program, arg_specs: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Types of every variable: ``{function: {variable: spec structure}}``.

    Args:
      program: Function-IR program (lowering keeps the same variables, qualified).
      arg_specs: specs of main's arguments (leading batch dimension, static shapes).
    Raises:
      TypeInferenceError: a variable with two types, a non-boolean condition, a function
        whose result cannot be typed, or a non-static shape.
      PrimitiveError: a primitive failed while being traced (names its source line).
    """
    batch = None
    for s in tf.nest.flatten(arg_specs):
        batch = s.shape[0]
        break
    if batch is None:
        raise TypeInferenceError("a batched function needs at least one tensor argument with a "
                                 "leading batch dimension")
    return _Inference(program, int(batch)).run(arg_specs)


def qualified_types(types: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{function: {var: spec}}`` -> ``{"function.var": spec}`` (the lowered names)."""
    return {f"{f}.{v}": s for f, env in types.items() for v, s in env.items()}


def batch_size_of(args: Any) -> Any:
    """The leading dimension of the first leaf of ``args`` (static if known)."""
    for x in tf.nest.flatten(args):
        x = tf.convert_to_tensor(x)
        return x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
    raise AutobatchError("a batched function needs at least one tensor argument")


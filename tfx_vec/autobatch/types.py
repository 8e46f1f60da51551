"""Values and types: abstract evaluation of a program, and fitting values to their types.

A variable's *type* is a structure (nested tuples/namedtuples) of :class:`tf.TensorSpec` whose
leading dimension is the batch size (``None`` when it is unknown at trace time, in a graph).
:func:`infer_types` finds one for every variable of every function by tracing each primitive
in a ``FuncGraph`` on placeholders of its inputs' types (no user annotations), propagating
through calls to a fixed point, so recursion works as soon as one path (the base case) gives a
function's result a type.  What a primitive may produce, per leaf:

* a tensor whose leading dimension is the batch;
* a tensor or array whose leading dimension is 1, or a rank-0 one: the same for every member,
  broadcast to the batch;
* a Python ``bool``/``int``/``float`` literal: *weakly typed*.  It takes the dtype (and shape)
  of the variable it is assigned to, or of the values it meets in a primitive (``count = 0``
  then ``count = count + n`` with ``n`` int64 makes ``count`` int64); alone it is ``bool``,
  ``int32`` or ``float32``, as ``tf.constant`` makes it.

Otherwise a variable keeps one structure, dtype and shape; with ``shapes="broadcast"`` (TFP's
auto_batching rule) values of different shapes make the variable their broadcast, and each
value is broadcast to it when assigned.  :func:`fit` is what every runtime applies when it
writes a value, so they all agree.

Example:
    >>> import tensorflow as tf
    >>> spec_of((tf.zeros([4, 2]), tf.zeros([4], tf.int32)))[1]
    TensorSpec(shape=(4,), dtype=tf.int32, name=None)
    >>> fit(3, tf.TensorSpec([2], tf.int64), 2).numpy().tolist()
    [3, 3]
"""
from __future__ import annotations

import itertools
import linecache
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import func_graph

from . import gathered, ir, replay
from .errors import AutobatchError, PrimitiveError, TypeInferenceError

__all__ = ["run_primitive", "fit", "select", "spec_of", "weak_of", "infer_types",
           "qualified_types", "format_spec", "zeros_of", "batch_size_of", "leading",
           "stateless", "SHAPE_RULES"]

SHAPE_RULES = ("exact", "broadcast")
_KINDS = {"bool": 0, "int": 1, "float": 2, "complex": 3}
_DEFAULT = {0: tf.bool, 1: tf.int32, 2: tf.float32, 3: tf.complex64}


def _is_literal(x: Any) -> bool:
    """A Python scalar (numpy's have a dtype of their own, so they are not)."""
    return type(x) in (bool, int, float, complex)


def _kind(dtype: tf.DType) -> int | None:
    if dtype == tf.bool:
        return 0
    if dtype.is_integer:
        return 1
    if dtype.is_floating:
        return 2
    if dtype.is_complex:
        return 3
    return None


# {{{ values

def spec_of(value: Any) -> Any:
    """The structure of TensorSpecs describing ``value``."""
    return tf.nest.map_structure(
        lambda x: tf.TensorSpec(tf.convert_to_tensor(x).shape, tf.convert_to_tensor(x).dtype),
        value)


def weak_of(value: Any) -> tuple[bool, ...]:
    """For each leaf of ``value``: is it a Python literal (weakly typed)?"""
    return tuple(_is_literal(x) for x in tf.nest.flatten(value))


def zeros_of(spec: Any, batch: Any, leading: Sequence[int] = ()) -> Any:
    """Zeros of a type for ``batch`` members, with extra ``leading`` dimensions."""
    return tf.nest.map_structure(
        lambda s: tf.zeros(list(leading) + [batch] + s.shape.as_list()[1:], s.dtype), spec)


def leading(shape: tf.TensorShape) -> int | None:
    """The leading dimension of ``shape`` as an int (None if unknown), TF1 shapes included."""
    return tf.compat.dimension_value(shape[0])


def batch_size_of(args: Any) -> Any:
    """The leading dimension of the first leaf of ``args`` (static if known)."""
    for x in tf.nest.flatten(args):
        x = tf.convert_to_tensor(x)
        return leading(x.shape) if leading(x.shape) is not None else tf.shape(x)[0]
    raise AutobatchError("a batched function needs at least one tensor argument")


def fit(value: Any, spec: tf.TensorSpec, batch: Any) -> tf.Tensor:
    """One leaf of a value as its variable's type: a literal made with the variable's dtype,
    a tensor cast to it (type inference allows this only for weakly typed values), a value
    without a batch dimension (rank 0, or leading dimension 1) or of a smaller shape
    broadcast to ``[batch] + spec.shape[1:]``."""
    if not isinstance(value, tf.Tensor):
        value = (tf.constant(value, spec.dtype) if _is_literal(value)
                 else tf.convert_to_tensor(value))
    if value.dtype != spec.dtype:
        value = tf.cast(value, spec.dtype)
    target = spec.shape
    if value.shape == target:  # the common case: nothing to do
        return value
    rank = target.rank
    if 0 < value.shape.rank < rank:  # a member's value of lower rank: align its trailing dims
        shape = tf.shape(value)
        value = tf.reshape(value, tf.concat([shape[:1], tf.ones([rank - value.shape.rank],
                                                                tf.int32), shape[1:]], 0))
    return tf.broadcast_to(value, tf.concat([tf.reshape(batch, [1]),
                                             tf.constant(target.as_list()[1:], tf.int32)], 0))


@tf.autograph.experimental.do_not_convert
def run_primitive(prim: ir.Primitive, values: Sequence[Any], batch: Any,
                  types: Sequence[Any]) -> tuple:
    """Run ``prim`` on whole-batch ``values``; each output fitted to its type in ``types``."""
    try:
        outs = replay.replay(prim.fn, values)
        if outs is None:
            outs = prim.fn(*values)
        return tuple(tf.nest.map_structure(lambda x, s: fit(x, s, batch), o, t)
                     for o, t in zip(outs, types))
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


def select(mask: tf.Tensor, new: Any, old: Any, what: str = "",
           shaped: dict | None = None) -> Any:
    """Per member: ``new`` where ``mask`` else ``old`` (structures of batched tensors).
    ``shaped``: the mask reshaped for wider values, by rank, kept between calls with the same
    mask (a block selects most of its variables with one mask: one reshape to trace each)."""
    def leaf(n, o):
        n = tf.convert_to_tensor(n)
        if n.shape.rank == mask.shape.rank:  # nothing to reshape
            return tf.where(mask, n, o)
        cache = {} if shaped is None else shaped
        if n.shape.rank not in cache:
            cache[n.shape.rank] = tf.reshape(mask, [-1] + [1] * (n.shape.rank - 1))
        return tf.where(cache[n.shape.rank], n, o)
    try:
        return tf.nest.map_structure(leaf, new, old)
    except (ValueError, TypeError) as e:
        raise TypeInferenceError(f"{what}: a new value does not match the variable's earlier "
                                 f"structure/dtype/shape: {e}") from e


def format_spec(spec: Any) -> str:
    def one(s):
        return f"{s.dtype.name}{s.shape.as_list()}"
    if isinstance(spec, tf.TensorSpec):
        return one(spec)
    return str(tf.nest.pack_sequence_as(spec, [one(s) for s in tf.nest.flatten(spec)])
               ).replace("'", "")

# }}}

# {{{ type inference


class _Var:
    """What inference knows of a variable: its spec structure and which leaves are weak."""

    def __init__(self, spec: Any, weak: tuple[bool, ...]):
        self.spec, self.weak = spec, weak

    def resolved(self) -> Any:
        """Weak leaves get the default dtype of their kind."""
        leaves = [tf.TensorSpec(s.shape, _DEFAULT[_kind(s.dtype)]) if w else s
                  for s, w in zip(tf.nest.flatten(self.spec), self.weak)]
        return tf.nest.pack_sequence_as(self.spec, leaves)


class _Inference:
    def __init__(self, program: ir.Program, batch: int | None, shapes: str):
        self.program, self.batch, self.shapes = program, batch, shapes
        self.env: dict[str, dict[str, _Var]] = {name: {} for name in program.functions}
        self.cache: dict[tuple, tuple] = {}
        self.changed = False

    # -- joining what a variable is assigned ---------------------------------------------
    def merge(self, fname: str, var: str, spec: Any, weak: tuple, loc: str) -> None:
        env = self.env[fname]
        if var not in env:
            env[var] = _Var(spec, weak)
            self.changed = True
            return
        old = env[var]
        try:
            tf.nest.assert_same_structure(old.spec, spec)
        except (ValueError, TypeError):
            raise self._conflict(fname, var, old.spec, spec, loc, "structure") from None
        leaves, flags = [], []
        for o, ow, n, nw in zip(tf.nest.flatten(old.spec), old.weak, tf.nest.flatten(spec),
                                weak):
            s, w = self._join(o, ow, n, nw, lambda what: self._conflict(
                fname, var, old.spec, spec, loc, what))
            leaves.append(s)
            flags.append(w)
        new = _Var(tf.nest.pack_sequence_as(old.spec, leaves), tuple(flags))
        if new.weak != old.weak or not all(
                a.dtype == b.dtype and a.shape == b.shape
                for a, b in zip(tf.nest.flatten(new.spec), tf.nest.flatten(old.spec))):
            env[var] = new
            self.changed = True

    def _join(self, o: tf.TensorSpec, ow: bool, n: tf.TensorSpec, nw: bool, conflict):
        # shape: a weak literal (a scalar per member) takes the variable's shape
        if o.shape == n.shape:
            shape = o.shape
        elif nw and n.shape.rank == 1:
            shape = o.shape
        elif ow and o.shape.rank == 1:
            shape = n.shape
        elif self.shapes == "broadcast":
            try:
                shape = tf.broadcast_static_shape(o.shape, n.shape)
            except ValueError:
                raise conflict("shape (not broadcastable)") from None
        else:
            raise conflict("shape")
        # dtype: a weak literal takes the dtype of a strong value
        ko, kn = _kind(o.dtype), _kind(n.dtype)
        if ow and nw:
            return tf.TensorSpec(shape, _DEFAULT[max(ko, kn)]), True
        if ow or nw:
            (lit, kl), (strong, ks) = ((o, ko), (n, kn)) if ow else ((n, kn), (o, ko))
            if ks is None or kl > ks:
                raise conflict("dtype")
            return tf.TensorSpec(shape, strong.dtype), False
        if o.dtype != n.dtype:
            raise conflict("dtype")
        return tf.TensorSpec(shape, o.dtype), False

    @staticmethod
    def _conflict(fname, var, old, new, loc, what) -> TypeInferenceError:
        hint = ("; a variable must keep one structure, dtype and shape (cast or reshape the "
                "value, e.g. with tf.cast or tf.broadcast_to")
        if what == "shape":
            hint += ", or decorate with ab.function(shapes=\"broadcast\") to give the variable "\
                    "the broadcast of its values' shapes, as TFP's auto_batching does"
        return TypeInferenceError(
            f"{loc}: variable {var!r} of {fname} is {format_spec(old)} in one place and "
            f"{format_spec(new)} here (different {what}){hint})")

    # -- what a primitive produces --------------------------------------------------------
    def batched_leaf(self, x: Any, loc: str, what: str) -> tuple[tf.TensorSpec, bool]:
        """The type a primitive's output leaf gets (see the module docstring)."""
        if _is_literal(x):
            dtype = tf.convert_to_tensor(x).dtype
            return tf.TensorSpec([self.batch], dtype), True
        try:
            t = x if tf.is_tensor(x) else tf.convert_to_tensor(x)
        except (TypeError, ValueError) as e:
            raise TypeInferenceError(f"{loc}: {what} is {type(x).__name__} {x!r}, not a tensor "
                                     "or a (nested tuple of) tensors") from e
        shape = t.shape
        if shape.rank is None or not shape[1:].is_fully_defined():
            raise TypeInferenceError(
                f"{loc}: {what} has shape {shape}: every value must have a static shape "
                "except its leading (batch) dimension")
        lead = leading(shape) if shape.rank else 1
        if shape.rank and (lead == self.batch or (lead is None and self.batch is None)):
            return tf.TensorSpec(shape, t.dtype), False
        if lead == 1:
            return tf.TensorSpec([self.batch] + shape.as_list()[1:], t.dtype), False
        size = "unknown at trace time" if self.batch is None else self.batch
        raise TypeInferenceError(
            f"{loc}: {what} has shape {shape.as_list()}, but the batch size is {size}: a "
            "value's leading dimension is the batch (or 1, or absent, for a value every member "
            "shares); build per-member values from the arguments, e.g. tf.zeros_like(n)")

    def _trace(self, prim: ir.Primitive, specs: tuple) -> tuple:
        """The outputs of ``prim`` traced on placeholders of ``specs`` (literals kept), kept
        for :mod:`.replay` unless it calls a function that a runtime builds differently
        (:func:`.gathered.on_active_members`: for the members a block runs for)."""
        graph = func_graph.FuncGraph(f"autobatch_types_{prim.loc}")
        calls = gathered.calls()
        with graph.as_default():
            args = [tf.nest.map_structure(
                lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), spec) for spec in specs]
            outs = prim.fn(*args)
        replay.record(prim.fn, graph, args, outs, replayable=gathered.calls() == calls)
        return outs

    def primitive(self, fname: str, prim: ir.Primitive) -> None:
        env = self.env[fname]
        if not all(v in env for v in prim.inputs):
            return
        inputs = [env[v] for v in prim.inputs]
        key = (id(prim), repr([(v.resolved(), v.weak) for v in inputs]))
        if key not in self.cache:
            self.cache[key] = self._outputs(prim, inputs)
        promoted, outs = self.cache[key]
        for v, var in zip(prim.inputs, promoted):
            if var is not None:
                self.merge(fname, v, var.spec, var.weak, prim.loc)
        for var, out in zip(prim.outputs, outs):
            self.merge(fname, var, *out, prim.loc)

    def _outputs(self, prim: ir.Primitive, inputs: list[_Var]) -> tuple[list, list]:
        """Trace ``prim``; when that fails and some inputs are weak, retry with them typed as
        strong inputs of their kind (``count + n``, ``acc + vector``).  Returns the inputs so
        promoted (None where unchanged) and each output's (spec, weak flags)."""
        specs = tuple(v.resolved() for v in inputs)
        try:
            outs = self._trace(prim, specs)
            promoted = [None] * len(inputs)
        except AutobatchError:
            raise
        except Exception as first:
            outs, promoted = self._retry_promoted(prim, inputs, first)
        results = []
        for k, o in enumerate(outs if isinstance(outs, tuple) else (outs,)):
            flat = [self.batched_leaf(x, prim.loc, f"value {k} of `{prim.text}`")
                    for x in tf.nest.flatten(o)]
            results.append((tf.nest.pack_sequence_as(o, [s for s, _ in flat]),
                            tuple(w for _, w in flat)))
        return promoted, results

    def _retry_promoted(self, prim, inputs, first):
        """Retry with each weak input leaf as a strong input leaf of its kind: its dtype, and
        (for a per-member scalar) maybe its shape; one choice per kind, each combination."""
        choices: dict[int, list] = {}
        for v in inputs:
            for s, w in zip(tf.nest.flatten(v.spec), v.weak):
                k = _kind(s.dtype)
                if not w and k is not None and s not in choices.setdefault(k, []):
                    choices[k].append(s)
        options = {k: [(s, False) for s in c] + [(s, True) for s in c if s.shape.rank > 1]
                   for k, c in choices.items()}
        for combo in itertools.product(*options.values()):
            pick = dict(zip(options, combo))
            promoted = [self._promote(v, pick) for v in inputs]
            if all(p is None for p in promoted):
                continue
            try:
                outs = self._trace(prim, tuple((p or v).resolved()
                                               for p, v in zip(promoted, inputs)))
            except Exception:
                continue
            return outs, promoted
        raise PrimitiveError(f"{_failing_line(prim, first)} failed: {type(first).__name__}: "
                             f"{first}") from first

    @staticmethod
    def _promote(v: _Var, pick: dict) -> _Var | None:
        """``v`` with its weak leaves as the strong spec picked for their kind (None if none)."""
        leaves, flags = [], []
        for s, w in zip(tf.nest.flatten(v.spec), v.weak):
            chosen = pick.get(_kind(s.dtype)) if w else None
            if chosen is None:
                leaves.append(s)
                flags.append(w)
                continue
            strong, with_shape = chosen
            shape = strong.shape if with_shape and s.shape.rank == 1 else s.shape
            leaves.append(tf.TensorSpec(shape, strong.dtype))
            flags.append(False)
        if tuple(flags) == v.weak:
            return None
        return _Var(tf.nest.pack_sequence_as(v.spec, leaves), tuple(flags))

    def call(self, fname: str, op: ir.Call) -> None:
        env, callee = self.env[fname], self.program.functions[op.callee]
        for p, a in zip(callee.params, op.args):
            if a in env:
                self.merge(op.callee, p, env[a].spec, env[a].weak, op.loc)
        result = self.env[op.callee].get(callee.result)
        if result is not None:
            self.merge(fname, op.output, result.spec, result.weak, op.loc)

    def run(self, arg_specs: Sequence[Any], arg_weak: Sequence[tuple]) -> dict:
        main = self.program.functions[self.program.main]
        for p, s, w in zip(main.params, arg_specs, arg_weak):
            self.merge(main.name, p, s, w, main.loc)
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
        types = {f: {v: var.resolved() for v, var in env.items()}
                 for f, env in self.env.items()}
        self.check(types)
        return types

    def check(self, types: dict) -> None:
        for f in self.program.functions.values():
            env = types[f.name]
            if f.result not in env:
                raise TypeInferenceError(
                    f"{f.loc}: could not give the result of {f.name} a type: every path that "
                    "returns calls it again (a recursion with no base case?), or it is never "
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


def stateless(program: ir.Program) -> bool:
    """Did type inference trace every primitive of ``program`` without making a stateful op?
    Moves and constants are stateless by construction.  A runtime may then build its loops
    without TensorFlow's automatic control dependencies, which only order stateful ops but
    cost a pass over every op of every loop body built (a fifth of tracing NUTS)."""
    # a lowered program runs its flat block list (which passes may have rewritten)
    blocks = program.blocks if program.lowered else [
        b for f in program.functions.values() for b in f.blocks]
    return all(replay.stateless_function(op.fn) for b in blocks for op in b.ops
               if isinstance(op, ir.Primitive) and not ir.is_move(op)
               and not ir.constant_value(op)[0])


def infer_types(program: ir.Program, arg_specs: Sequence[Any],
                arg_weak: Sequence[tuple] | None = None,
                shapes: str = "exact") -> dict[str, dict[str, Any]]:
    """Types of every variable: ``{function: {variable: spec structure}}``.

    Args:
      program: Function-IR program (lowering keeps the same variables, qualified).
      arg_specs: specs of main's arguments, all with the same leading (batch) dimension, an
        int or None (unknown at trace time).
      arg_weak: per argument, which leaves were Python literals (weakly typed).
      shapes: ``"exact"`` or ``"broadcast"`` (see the module docstring).
    Raises:
      TypeInferenceError: a variable with two types, a non-boolean condition, a function
        whose result cannot be typed, or a value that does not fit the batch.
      PrimitiveError: a primitive failed while being traced (names its source line).
    """
    leaves = [s for spec in arg_specs for s in tf.nest.flatten(spec)]
    if not leaves or any(s.shape.rank == 0 for s in leaves):
        raise TypeInferenceError("every argument of a batched function needs a leading batch "
                                 "dimension")
    if arg_weak is None:
        arg_weak = [(False,) * len(tf.nest.flatten(s)) for s in arg_specs]
    batch = leading(leaves[0].shape)
    return _Inference(program, batch, shapes).run(arg_specs, arg_weak)


def qualified_types(types: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{function: {var: spec}}`` -> ``{"function.var": spec}`` (the lowered names)."""
    return {f"{f}.{v}": s for f, env in types.items() for v, s in env.items()}

# }}}

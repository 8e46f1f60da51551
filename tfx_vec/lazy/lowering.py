"""Lowering: a canonical program key -> a ``tf.function(jit_compile=True)`` that replays it.

The replay walks the key's entries in order (inputs before users) and calls each op's TF API on
the replayed tensors (``ops.call``), so TensorFlow's own lowering to XLA HLO does the rest.
Parameters arrive as three arguments: the data tensors, one float64 vector of the Python scalars
(each cast to its node's dtype) and the variables (resources).  Variable reads happen first and
the ``assign``s last, so every read sees the value from before the step; under XLA the updates
are XLA resource updates written back to the variables (TensorFlow's XLA launch may alias
them to the variables' buffers).

Each ``grad`` entry gets a persistent ``tf.GradientTape``, active over the whole replay, that
watches that gradient's sources as they are produced and is paused (``stop_recording``) for the
entries outside the lazy tape's window, as eager TF records only ops run inside the ``with``
block; the entry calls ``tape.gradient``: forward and backward are traced, and compiled,
together.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec.lazy import ir
    >>> a = ir.Node.leaf("data", tf.constant([1.0, 2.0]))
    >>> b = ir.Node("math.square", (a,), ((("x", -1),), ()), (2,), tf.float32)
    >>> p = ir.canonicalize([b])
    >>> build(p.key)(p.data, tf.zeros([0], tf.float64), [])[0].numpy().tolist()
    [1.0, 4.0]
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import cancellation, context, execute
from tensorflow.python.framework.ops import EagerTensor
from tensorflow.python.ops import gen_resource_variable_ops

from . import raw
from .calls import replay_call
from .errors import LazyCompileError
from .ops import OPS, call

__all__ = ["build", "read_variable", "assign_variable"]


def read_variable(var: Any, dtype: tf.DType) -> tf.Tensor:
    """Read a ``tf.Variable`` or a variable's resource handle (eagerly or while tracing)."""
    if isinstance(var, tf.Variable):
        return var.read_value()
    return gen_resource_variable_ops.read_variable_op(var, dtype)


def assign_variable(var: Any, value: tf.Tensor) -> None:
    """Write ``value`` to a ``tf.Variable`` or a variable's resource handle."""
    if isinstance(var, tf.Variable):
        var.assign(value)
    else:
        gen_resource_variable_ops.assign_variable_op(var, value)


def _grad(tape: tf.GradientTape, entry: tuple, values: list, handles: dict,
          entries: tuple) -> list:
    n_src, n_og, _ = entry[1]
    idx = entry[3]
    target = values[idx[0]]
    src = idx[1:1 + n_src]
    sources = [handles[j] if j in handles else values[j] for j in src]
    og = [values[j] for j in idx[1 + n_src:]] or None
    grads = tape.gradient(target, sources, output_gradients=og,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    # TensorFlow has no zeros for an unconnected resource source: the variable's own.
    return [tf.convert_to_tensor(g) if g is not None else
            tf.zeros(entries[j][1][0], tf.as_dtype(entries[j][1][1]))
            for g, j in zip(grads, src)]


def _reads(entry: tuple) -> tuple:
    """The entries whose values ``entry`` reads (a call's variable leaves are resources; its
    current values are read only where they differ from the leaf)."""
    if entry[0] != "call":
        return entry[3]
    n_in, inputs = entry[1][1], entry[3]
    n_var = (len(inputs) - n_in) // 2
    leaves, now = inputs[n_in:n_in + n_var], inputs[n_in + n_var:]
    return inputs[:n_in] + tuple(j for j, k in zip(now, leaves) if j != k)


def build(key: tuple, jit: bool = True) -> Callable:
    """The jit-compiled replay of the program ``key`` (see ``ir.canonicalize``).

    ``jit=False`` gives the same replay as a plain ``tf.function``: the runtime's safety net
    for a program holding an op XLA cannot compile (counted as ``fallback::no_xla``).
    """
    entries, outputs, assigns = key
    grads = [i for i, e in enumerate(entries) if e[0] == "grad"]
    inside = {g: frozenset(entries[g][1][2]) for g in grads}
    watch = {}  # entry -> the grads whose sources it is
    for g in grads:
        for j in entries[g][3][1:1 + entries[g][1][0]]:
            watch.setdefault(j, []).append(g)
    leaf = ("data", "var", "scalar", "const", "out")
    var_pos, k = {}, 0
    for i, e in enumerate(entries):
        if e[0] == "var":
            var_pos[i] = k
            k += 1
    # A variable only written (its first assignment) is not read: it may be uninitialized.
    read = {j for e in entries if e[0] not in leaf or e[0] == "out" for j in _reads(e)}
    read.update(outputs)

    def replay(data: list, scalars: tf.Tensor, variables: list) -> list:
        values: list[Any] = [None] * len(entries)
        handles: dict = {}   # var entry -> its resource, where a gradient's source is a variable
        di = si = vi = 0
        tapes = {g: tf.GradientTape(persistent=True) for g in grads}
        with contextlib.ExitStack() as active:
            for t in tapes.values():
                active.enter_context(t)
            for i, e in enumerate(entries):
                op = e[0]
                paused = contextlib.ExitStack()
                if tapes and op not in leaf:  # like eager: only ops in a tape's window are on it
                    for g, t in tapes.items():
                        if i not in inside[g]:
                            paused.enter_context(t.stop_recording())
                if op == "data":
                    v = data[di]
                    di += 1
                elif op == "var":
                    v = None
                    if i in watch and not isinstance(variables[vi], tf.Variable):
                        # A variable source is differentiated through its resource, as
                        # TensorFlow does: every read of it in the window counts, those of a
                        # replayed library call (calls.py) included.
                        handles[i] = variables[vi]
                        for g in watch[i]:
                            tapes[g].watch(variables[vi])
                    if i in read:
                        v = read_variable(variables[vi], tf.as_dtype(e[1][1]))
                        if not isinstance(variables[vi], tf.Variable):
                            v.set_shape(e[1][0])
                    vi += 1
                elif op == "scalar":
                    v = tf.cast(scalars[si], tf.as_dtype(e[1][1]))
                    si += 1
                elif op == "const":
                    value, dtype = e[1]
                    v = value if dtype is None else tf.constant(np.array(value), dtype)
                elif op == "out":
                    v = values[e[3][0]][e[1][0]]
                elif op == "grad":
                    with paused:
                        v = _grad(tapes[i], e, values, handles, entries)
                elif op == "call":   # a library call (calls.py) on the program's variables
                    token, n_in = e[1]
                    n_var = (len(e[3]) - n_in) // 2
                    leaves, now = e[3][n_in:n_in + n_var], e[3][n_in + n_var:]
                    with paused:
                        v = replay_call(token, [values[j] for j in e[3][:n_in]],
                                        [variables[var_pos[j]] for j in leaves],
                                        [None if j == k else values[j]
                                         for j, k in zip(now, leaves)])
                else:
                    layout, attrs = e[1]
                    try:
                        with paused:
                            inputs = [values[j] for j in e[3]]
                            v = raw.call(layout, attrs, inputs) if op == "raw" else \
                                call(OPS[op], inputs, layout, attrs)
                    except Exception as err:  # name the node, keep the cause
                        raise LazyCompileError(f"lowering node %{i} ({op}) failed: {err}") \
                            from err
                    if e[2] is None:
                        v = tf.nest.flatten(v)
                if i not in handles:
                    for g in watch.get(i, ()):
                        tapes[g].watch(v)
                values[i] = v
        for var_i, val_i in assigns:
            assign_variable(variables[var_pos[var_i]], values[val_i])
        return [values[i] for i in outputs]

    return Compiled(tf.function(replay, jit_compile=jit, autograph=False))


class Compiled:
    """A lowered program.  The first call traces (and XLA compiles); later calls go straight to
    the traced concrete function with flat arguments, skipping ``tf.function``'s per-call
    argument signature matching (about 1 ms for a step with 18 variables here).  When no
    gradient tape or forward accumulator is active, no cancellation scope is open and the
    outputs are a flat list of plain tensors, a later call runs the traced function as one op
    (what the concrete function's own call does in that case, less its per-call checks and
    output repacking); otherwise it takes the concrete function's call."""

    def __init__(self, function: Any):
        self.function = function
        self._concrete: Any = None
        self._flat: Callable | None = None
        self._direct: tuple[str, int] | None = None  # (function name, outputs) for one op

    @property
    def traced(self) -> bool:
        """True once the first call has traced and compiled (later calls are cheap)."""
        return self._concrete is not None

    def __call__(self, data: list, scalars: Any, variables: list) -> list:
        if self._flat is not None:
            flat = data + [scalars] + [v if type(v) is EagerTensor else v.handle
                                       if isinstance(v, tf.Variable) else v for v in variables]
            if self._direct is not None and _plain_call():
                ctx = context.context()
                name, n_out = self._direct
                return execute.quick_execute(
                    name, n_out, flat + self._concrete.captured_inputs,
                    _call_attrs(ctx.function_call_options), ctx)
            return list(self._flat(flat, self._concrete.captured_inputs))
        if self._concrete is None:
            self._concrete = self.function.get_concrete_function(data, scalars, variables)
            flat_call = getattr(self._concrete, "_call_flat", None)  # private: keep a fallback
            if flat_call is not None and \
                    len(self._concrete.inputs) == len(data) + 1 + len(variables):
                self._flat = flat_call
                self._direct = _direct_call(self._concrete)
        return list(self._concrete(data, scalars, variables))


def _plain_call() -> bool:
    """True where a traced function's call is just its op: eager, no tape or forward accumulator
    active (nothing to record), no cancellation scope."""
    return pywrap_tfe.TFE_Py_TapeSetIsEmpty() and context.executing_eagerly() and \
        cancellation.context() is None


def _call_attrs(options: Any) -> tuple:
    """The function call op's attrs from the context's current call options (read every call:
    a scope such as ``function_executor_type`` changes them)."""
    return tuple(itertools.chain(*options.as_attrs().items()))


def _direct_call(concrete: Any) -> tuple[str, int] | None:
    """``(name, number of outputs)`` of the inference function behind ``concrete`` when its
    structured outputs are a flat list of tensors without handle data (so the op's outputs are
    the call's result as they are); None otherwise (and where TensorFlow's internals differ)."""
    fn = getattr(concrete, "_inference_function", None)
    outputs = getattr(concrete, "structured_outputs", None)
    try:
        out_types = fn.function_type.flat_outputs
        name = fn.name.decode("utf-8")
    except AttributeError:
        return None
    if type(outputs) is not list or len(outputs) != len(out_types) or \
            not all(isinstance(o, tf.Tensor) for o in outputs) or \
            any(t.dtype._handle_data for t in out_types):  # pylint: disable=protected-access
        return None
    return name, len(out_types)

"""TF1 while loops (``Enter``/``Merge``/``Switch``/``LoopCond``/``NextIteration``/``Exit``
ops) built in a loop body kept in the caller's TF1 graph: the gradient loop ``tf.gradients``
builds for a TF1 while loop, or a loop the body builds itself next to such a gradient.

The ops of one loop form a cycle, so the walker sees each loop as one unit (:class:`V1Loop`,
found by :func:`group_loops`): its inputs are what enters the loop, its outputs what exits
it.  Its condition and body are views of the loop's ops (the condition reads each
variable's ``Merge``, the body its ``Switch``'s true branch, both read the loop-invariant
``Enter`` values) and the loop is vectorized as a functional ``While`` is (see
``control_flow.py``): the loop-invariant ``Enter`` values are pass-through variables.

A TF1 conditional (``Switch``/``Merge`` outside such a loop, or inside one) in these bodies
is a :class:`~tfx_vec.VectorizationError`.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> v2 = tf.compat.v1.control_flow_v2_enabled()
    >>> tf.compat.v1.disable_control_flow_v2()
    >>> with tf.Graph().as_default():
    ...     x = tf.constant([1.0, 2.0])
    ...     _, y = tf.compat.v1.while_loop(lambda k, v: k < 3, lambda k, v: (k + 1, v * x),
    ...                                    [0, x])                    # y = x ** 4
    ...     dy = tfx_vec.pfor(lambda i: tf.gradients(y[i], x)[0], 2)
    ...     with tf.compat.v1.Session() as sess:
    ...         print(sess.run(dy).tolist())
    [[4.0, 0.0], [0.0, 32.0]]
    >>> if v2: tf.compat.v1.enable_control_flow_v2()
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfx_vec.pfor.converters.control_flow import While
from tfx_vec.pfor.converters.lists import restore_shapes
from tfx_vec.pfor.converters.parsing_ops import unbatch_inputs
from tfx_vec.pfor.errors import VectorizationError, op_error
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

__all__ = ["V1Loop", "group_loops", "V1_WHILE"]

#: The type the walker and the registry know a :class:`V1Loop` unit by.
V1_WHILE = "TF1WhileLoop"

#: Ops of TF1 control flow, as they appear in a loop.
_LOOP_OPS = frozenset({"Enter", "Merge", "Switch", "LoopCond", "NextIteration", "Exit"})
_OTHER_CONTROL_FLOW = frozenset({"Switch", "Merge", "RefSwitch", "RefMerge", "RefEnter",
                              "RefExit", "RefNextIteration"})


def _context(op: tf.Operation):
    return op._get_control_flow_context()  # pylint: disable=protected-access


class _View:
    """Some of a loop's ops seen as a function body (what ``Vectorizer.convert_graph``
    walks): ``inputs`` are bound to values, ``outputs`` are returned."""

    def __init__(self, graph: tf.Graph, ops: list, inputs: list, outputs: list,
                 control_outputs: list):
        self.graph, self._ops = graph, ops
        self.inputs, self.outputs, self.control_outputs = inputs, outputs, control_outputs

    def get_operations(self) -> list:
        return list(self._ops)

    def __getattr__(self, name):
        return getattr(self.graph, name)


class V1Loop:
    """One TF1 while loop of a loop body, standing for all of its ops.

    ``inputs``: the initial value of each loop variable, then each loop-invariant value the
    loop reads; ``outputs``: each variable's ``Exit``, then the invariant values as the loop
    sees them (so that the variables line up with a functional ``While``'s).

    Example:
        >>> V1_WHILE
        'TF1WhileLoop'
    """

    type = V1_WHILE
    _is_stateful = True

    def __init__(self, loop_cond: tf.Operation, ops: list):
        ctx = _context(loop_cond)
        self.name = ctx.name
        self.graph = loop_cond.graph
        self.traceback = loop_cond.traceback
        self._parallel_iterations = ctx.parallel_iterations
        own = [op for op in ops if op.type in _LOOP_OPS and _context(op) is ctx]
        exits = [op for op in own if op.type == "Exit"]
        switches = [e.inputs[0].op for e in exits]
        merges = [s.inputs[0].op for s in switches]
        if any(s.type != "Switch" for s in switches) or any(m.type != "Merge" for m in merges):
            raise op_error(loop_cond, f"the TF1 while loop {self.name} does not have the "
                                      "Enter -> Merge -> Switch -> Exit structure pfor reads")
        var_enters = [m.inputs[0].op for m in merges]
        nexts = [m.inputs[1].op for m in merges]
        invariant = [op for op in own if op.type == "Enter" and op not in var_enters]
        self._ops = ops
        self.inputs = [e.inputs[0] for e in var_enters + invariant]
        self.control_inputs = sorted({c for e in var_enters + invariant
                                      for c in e.control_inputs}, key=lambda o: o.name)
        shared = [e.outputs[0] for e in invariant]
        self.outputs = [e.outputs[0] for e in exits] + shared
        body_ops = [op for op in ops if op not in own]
        cond_in = [m.outputs[0] for m in merges] + shared
        body_in = [s.outputs[1] for s in switches] + shared
        bound = {t.ref() for t in cond_in + body_in}
        members = set(body_ops)
        for op in body_ops:
            for t in op.inputs:
                if t.op not in members and t.ref() not in bound:
                    raise op_error(op, f"the op reads {t.name} in the TF1 while loop "
                                       f"{self.name}, which is neither a loop variable nor "
                                       "a value entering the loop")
        self.cond = _View(self.graph, body_ops, cond_in, [loop_cond.inputs[0]], [])
        body_out = [n.inputs[0] for n in nexts] + shared
        effects = [c for n in nexts for c in n.control_inputs]
        self.body = _View(self.graph, body_ops, body_in, body_out, effects)
        #: The body with its side effects (accumulator pushes each step must run: nothing
        #: reads them) as extra outputs, or control outputs for ops without outputs.
        self.body_with_effects = _View(
            self.graph, body_ops, body_in,
            body_out + [c.outputs[0] for c in effects if c.outputs],
            [c for c in effects if not c.outputs])

    def get_attr(self, name: str) -> Any:
        if name != "parallel_iterations":
            raise ValueError(f"a TF1 while loop has no attribute {name}")
        return self._parallel_iterations

    def __repr__(self) -> str:
        return f"<TF1 while loop {self.name}>"


def group_loops(ops: list) -> dict:
    """``{op: V1Loop}`` for the ops of each outermost TF1 while loop among ``ops`` (in
    creation order); a TF1 conditional among the others is an error.

    Example:
        >>> import tensorflow as tf
        >>> with tf.Graph().as_default() as g:
        ...     y = tf.constant(1.0) * 2.0
        >>> group_loops(g.get_operations())
        {}
    """
    loops = {_context(op): op for op in ops if op.type == "LoopCond"}
    members: dict = {}
    for op in ops:
        ctx, outermost = _context(op), None
        while ctx is not None:
            if ctx in loops:
                outermost = ctx
            ctx = ctx.outer_context
        if outermost is not None:
            members.setdefault(outermost, []).append(op)
        elif op.type in _OTHER_CONTROL_FLOW or op.type in _LOOP_OPS:
            raise op_error(op, f"the TF1 control-flow op {op.name} is not part of a TF1 while "
                               "loop pfor can vectorize (a TF1 tf.cond in a loop body that "
                               "differentiates TF1 control flow made outside it is not "
                               "supported); enable control flow v2 or use tf.where")
    units = {}
    for ctx, frame_ops in members.items():
        loop = V1Loop(loops[ctx], frame_ops)
        units.update((op, loop) for op in frame_ops)
    return units


class _While(While):
    """The new loop's variables have no shape invariants: ops re-emitted in the body may lose
    shapes that TensorFlow's Python code had set (a TensorArray read's).  The body and the
    condition see each variable with the static shape the TF1 loop enforced."""

    def shape_invariant(self, i: int, stacked: bool) -> tf.TensorShape:
        return tf.TensorShape(None)

    def _values(self, flat, flags, rows=None) -> list:
        values = super()._values(flat, flags, rows)
        for w, original in zip(values, self.body.inputs):
            if type(w) is WrappedTensor and original.dtype not in (tf.variant, tf.resource):
                w.t.set_shape(tf.TensorShape([None]).concatenate(original.shape)
                              if w.is_stacked else original.shape)
        return values

    def _run_body(self, values, flags, n) -> list[tf.Tensor]:
        """Each step's new values, after the step's side effects (which the TF1 loop orders
        by control edges to its ``NextIteration`` ops)."""
        loop, vec = self.x.op, self.x.vectorizer
        outs = unbatch_inputs(vec.convert_graph(loop.body_with_effects, list(values), n), n)
        k = len(loop.body.outputs)
        effects = [w.t for w in outs[k:]]
        for op in loop.body_with_effects.control_outputs:
            effects.extend(vec.side_effects.get(op, ()))
        flat = self._flat(outs[:k], values, flags, n)
        with tf.control_dependencies(effects):
            return [tf.identity(t) for t in flat]


@register_converter(V1_WHILE)
def _convert(x: ConversionInput):
    loop = x.op
    if not isinstance(loop, V1Loop):
        raise VectorizationError(f"{V1_WHILE} converter called on {loop!r}")
    try:
        return restore_shapes(x, _While(x, loop.cond, loop.body).convert())
    except VectorizationError:
        raise
    except Exception as e:  # no per-iteration fallback for a loop of many ops: name it
        raise op_error(loop, f"the TF1 while loop {loop.name} could not be vectorized: "
                             f"{type(e).__name__}: {e}") from e

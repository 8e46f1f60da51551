"""Converters for TF1 resource stacks (``StackV2``, ``StackPushV2``, ``StackPopV2``,
``StackCloseV2``), with the semantics of TensorFlow's pfor.

There is no array of stacks, so all iterations share one stack and push/pop in lock step:

- a stack *created in the loop body* is created once; a push of a per-iteration value pushes
  the ``[n, ...]`` stacked value, and pops return stacked values.  Whether a stack holds
  stacked values is decided by the first push converted: once a loop-invariant value was
  pushed, a later push of a per-iteration value is a :class:`~tfx_vec.VectorizationError`
  (a later invariant push to a stacked stack is tiled);
- a stack *created outside the loop body* (the accumulators of a TF1 while loop, read by
  its gradient) may only be popped: each pop runs once and its value, which must be
  loop-invariant, is every iteration's value.  A push to it is an error, as is a pop when
  the iterations are vectorized in chunks (``parallel_iterations``), where every chunk
  would pop again;
- stack ops under control flow whose iterations are split by the loop index (a loop-variant
  ``tf.cond`` predicate or ``tf.while_loop`` condition, partitioned or, under XLA, masked)
  are an error: the iterations would no longer push and pop in lock step.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> from tensorflow.python.ops import data_flow_ops
    >>> with tf.Graph().as_default():
    ...     def body(i):
    ...         s = data_flow_ops.stack_v2(max_size=2, elem_type=tf.int32)
    ...         with tf.control_dependencies([data_flow_ops.stack_push_v2(s, i * 3)]):
    ...             return data_flow_ops.stack_pop_v2(s, elem_type=tf.int32)
    ...     out = tfx_vec.pfor(body, 3)
    ...     with tf.compat.v1.Session() as sess:
    ...         print(sess.run(out).tolist())
    [0, 3, 6]
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (conversion_state, create_op_like, handle_source,
                                              runs_every_iteration)
from tfx_vec.pfor.registry import (ConversionInput, WrappedTensor, register_converter,
                                   tile_to_stacked)

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []


def _stack_op(x: ConversionInput) -> tf.Operation:
    """The ``StackV2`` op (in the emitted graph) behind the handle ``x`` pushes to or pops."""
    if x.is_stacked(0):
        raise x.error("a stack handle that depends on the loop index cannot be vectorized")
    if not runs_every_iteration(x):
        raise x.error("a stack pushed or popped under control flow whose iterations depend on "
                      "the loop index (a loop-variant tf.cond predicate or while condition) "
                      "cannot be vectorized: the iterations would not push and pop in lock "
                      "step; move the stack operations out of that control flow")
    handle = handle_source(x, x.input(0).t)
    if handle.op.type != "StackV2":
        raise x.error(f"the stack handle comes from a {handle.op.type} op, not from StackV2")
    return handle.op


def _state(x: ConversionInput) -> tuple[set, dict]:
    """(StackV2 ops this conversion created, {StackV2 op: whether it holds stacked values})."""
    return conversion_state(x, "stacks", lambda: (set(), {}))


@register_converter("StackV2")
def _create(x: ConversionInput):
    if x.any_stacked:
        raise x.error("the maximum size of a stack created in the loop body must not depend "
                      "on the loop index")
    handle = create_op_like(x.op, [x.input(0).t])[0]
    _state(x)[0].add(handle.op)
    return [WrappedTensor(handle, False)]


@register_converter("StackPushV2")
def _push(x: ConversionInput):
    stack = _stack_op(x)
    created, holds_stacked = _state(x)
    if stack not in created:
        raise x.error("StackPushV2 not allowed on a stack created outside the loop body: the "
                      "iterations share that stack, so their pushes would interleave; create "
                      "the stack in the loop body instead")
    elem = x.input(1)
    is_stacked = holds_stacked.setdefault(stack, elem.is_stacked)
    if elem.is_stacked and not is_stacked:
        raise x.error("pushing a value that depends on the loop index to a stack that earlier "
                      "received a loop-invariant value is not supported; make the first push "
                      "depend on the loop index too")
    value = elem.t if elem.is_stacked or not is_stacked else tile_to_stacked(elem.t,
                                                                             x.loop_len)
    return [WrappedTensor(create_op_like(x.op, [x.input(0).t, value])[0], is_stacked)]


@register_converter("StackPopV2")
def _pop(x: ConversionInput):
    stack = _stack_op(x)
    created, holds_stacked = _state(x)
    if stack not in created and getattr(x.vectorizer, "chunked", False):
        raise x.error("popping a stack created outside the loop body while the iterations run "
                      "in chunks (parallel_iterations) would pop once per chunk; drop "
                      "parallel_iterations")
    # A stack without a converted push holds what was pushed outside the loop: one value
    # shared by all iterations.
    is_stacked = holds_stacked.setdefault(stack, False)
    value = create_op_like(x.op, [x.input(0).t])[0]
    # (the shape TensorFlow's gradient code set on the pop: the accumulated value's)
    shape = x.op.outputs[0].shape
    value.set_shape(tf.TensorShape([None]).concatenate(shape) if is_stacked else shape)
    return [WrappedTensor(value, is_stacked)]


@register_converter("StackCloseV2")
def _close(x: ConversionInput):
    _stack_op(x)
    create_op_like(x.op, [x.input(0).t])
    return []

"""Converters for TF1 resource TensorArrays (``TensorArrayV3`` and its ops) made outside the
loop body and read or written inside it (TF1 graphs; elsewhere TensorArrays are TensorLists,
see ``lists.py``).

The array is shared by all iterations (its handle is loop-invariant), so:

- a read or gather at per-iteration positions is one ``TensorArrayGatherV3`` of all of them;
- a write or scatter at per-iteration positions is one ``TensorArrayScatterV3`` (iterations must
  write different positions, as in the loop; a write of per-iteration values at the *same*
  position in every iteration is a :class:`~tfx_vec.VectorizationError`, the loop's result
  would depend on the iteration order);
- ops whose inputs are all loop-invariant (a write of one value, the size) run once.

A TensorArray created *inside* a TF1 body is traced as a TensorList instead (``trace.py``).

A gradient taken in the body through such an array (``tf.gradients`` of a value read from
it) makes a *gradient* array (``TensorArrayGradV3``), and each iteration has its own
gradient.  As in TensorFlow's pfor, that is one array for all iterations whose elements have
a leading iteration axis (``TensorArrayGradWithShape``): writes and reads of it happen at
positions every iteration shares (a per-iteration position is an error).

Example:
    >>> import numpy as np, tensorflow as tf, tfx_vec
    >>> with tf.Graph().as_default():
    ...     ta = tf.raw_ops.TensorArrayV3(size=3, dtype=tf.float32, clear_after_read=False)
    ...     flow = tf.raw_ops.TensorArrayScatterV3(handle=ta[0], indices=[0, 1, 2],
    ...                                            value=[1.0, 2.0, 3.0], flow_in=ta[1])
    ...     out = tfx_vec.pfor(lambda i: tf.raw_ops.TensorArrayReadV3(
    ...         handle=ta[0], index=2 - i, flow_in=flow, dtype=tf.float32) * 10.0, 3)
    ...     with tf.compat.v1.Session() as sess:
    ...         print(sess.run(out).tolist())
    [30.0, 20.0, 10.0]
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (conversion_state, create_op_like, fold_batch,
                                              handle_source, runs_every_iteration)
from tfx_vec.pfor.converters.nn_ops import converter
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

__all__: list[str] = []


def _shared_handle(x: ConversionInput) -> tf.Tensor:
    if x.is_stacked(0):
        raise x.error("a TensorArray handle that depends on the loop index cannot be "
                      "vectorized; create the array outside the loop body, or inside it as a "
                      "TensorList (control flow v2)")
    return x.input(0).t


def _gradient_arrays(x: ConversionInput) -> set:
    """The gradient arrays (``TensorArrayGradWithShape`` ops) this conversion made: their
    elements are ``[n, ...]``, every iteration's gradient."""
    return conversion_state(x, "gradient_arrays", set)


def _per_iteration_array(x: ConversionInput, handle: tf.Tensor) -> bool:
    return handle_source(x, handle).op in _gradient_arrays(x)


def _shared_position(x: ConversionInput, i: int) -> tf.Tensor:
    if not runs_every_iteration(x):
        raise x.error("a gradient TensorArray used under control flow whose iterations depend "
                      "on the loop index (a loop-variant tf.cond predicate or while "
                      "condition) cannot be vectorized: every iteration must read and write it "
                      "in lock step")
    if x.is_stacked(i):
        raise x.error("reading or writing a gradient TensorArray at positions that depend on "
                      "the loop index cannot be vectorized: every iteration must use the "
                      "same positions")
    return x.input(i).t


def _swap_leading(t: tf.Tensor) -> tf.Tensor:
    """Swap the first two axes (of a tensor of possibly unknown rank)."""
    return tf.transpose(t, tf.concat([[1, 0], tf.range(2, tf.rank(t))], 0))


@register_converter("TensorArrayGradV3")
def _grad(x: ConversionInput):
    handle = _shared_handle(x)
    flow = x.input(1)
    # A flow's value is a dummy: only the dependency on it matters.
    flow_in = tf.reduce_sum(flow.t) if flow.is_stacked else flow.t
    grad, flow_out = tf.raw_ops.TensorArrayGradWithShape(
        handle=handle, flow_in=flow_in, shape_to_prepend=tf.reshape(x.loop_len, [1]),
        source=x.attr("source"))
    _gradient_arrays(x).add(grad.op)
    return [WrappedTensor(grad, False), WrappedTensor(flow_out, False)]


def _invariant(x: ConversionInput) -> list[WrappedTensor]:
    return [WrappedTensor(t, False) for t in create_op_like(x.op, [w.t for w in x.inputs])]


@converter("TensorArrayReadV3")
def _read(x: ConversionInput):
    handle = _shared_handle(x)
    if _per_iteration_array(x, handle):
        return [WrappedTensor(tf.raw_ops.TensorArrayReadV3(
            handle=handle, index=_shared_position(x, 1), flow_in=x.input(2).t,
            dtype=x.attr("dtype")), True)]
    if not x.any_stacked:
        return _invariant(x)
    out = tf.raw_ops.TensorArrayGatherV3(handle=handle, indices=x.stacked_input(1),
                                         flow_in=x.input(2).t, dtype=x.attr("dtype"),
                                         element_shape=_element_shape(x.input(0).t))
    return [WrappedTensor(out, True)]


def _element_shape(handle: tf.Tensor) -> tf.TensorShape:
    """The array's element shape as its creating op declares it (unknown otherwise)."""
    op = handle.op
    if op.type == "TensorArrayV3":
        return tf.TensorShape(op.get_attr("element_shape"))
    return tf.TensorShape(None)


@converter("TensorArrayGatherV3")
def _gather(x: ConversionInput):
    handle = _shared_handle(x)
    if _per_iteration_array(x, handle):
        out = tf.raw_ops.TensorArrayGatherV3(handle=handle, indices=_shared_position(x, 1),
                                             flow_in=x.input(2).t, dtype=x.attr("dtype"))
        return [WrappedTensor(_swap_leading(out), True)]             # [k, n, ...] -> [n, k, ...]
    if not x.any_stacked:
        return _invariant(x)
    indices = x.stacked_input(1)                                        # [n, k]
    out = tf.raw_ops.TensorArrayGatherV3(handle=handle, indices=tf.reshape(indices, [-1]),
                                         flow_in=x.input(2).t, dtype=x.attr("dtype"),
                                         element_shape=_element_shape(handle))
    return [WrappedTensor(tf.reshape(out, tf.concat([tf.shape(indices), tf.shape(out)[1:]], 0)),
                          True)]


@register_converter("TensorArrayWriteV3", "TensorArrayScatterV3")
def _write(x: ConversionInput):
    handle = _shared_handle(x)
    if _per_iteration_array(x, handle):
        value = x.stacked_input(2)
        if x.op_type == "TensorArrayScatterV3":
            value = _swap_leading(value)                              # [n, k, ...] -> [k, n, ...]
        out = create_op_like(x.op, [handle, _shared_position(x, 1), value, x.input(3).t])[0]
        return [WrappedTensor(out, False)]
    if not x.any_stacked:
        return _invariant(x)
    if not x.is_stacked(1):
        raise x.error("every iteration writes a different value at the same position of a "
                      "TensorArray shared by all iterations (the result would depend on the "
                      "iteration order); write at positions that depend on the loop index")
    if x.op_type == "TensorArrayWriteV3":
        indices, value = x.stacked_input(1), x.stacked_input(2)        # [n], [n, ...]
    else:
        indices = tf.reshape(x.stacked_input(1), [-1])                 # [n*k]
        value = fold_batch(x.stacked_input(2))[0]                      # [n*k, ...]
    flow = tf.raw_ops.TensorArrayScatterV3(handle=handle, indices=indices, value=value,
                                           flow_in=x.input(3).t)
    return [WrappedTensor(flow, False)]


@register_converter("TensorArraySizeV3")
def _size(x: ConversionInput):
    _shared_handle(x)
    return _invariant(x)

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

from tfx_vec.pfor.converters._helpers import create_op_like, fold_batch
from tfx_vec.pfor.converters.nn_ops import converter
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

__all__: list[str] = []


def _shared_handle(x: ConversionInput) -> tf.Tensor:
    if x.is_stacked(0):
        raise x.error("a TensorArray handle that depends on the loop index cannot be "
                      "vectorized; create the array outside the loop body, or inside it as a "
                      "TensorList (control flow v2)")
    return x.input(0).t


def _invariant(x: ConversionInput) -> list[WrappedTensor]:
    return [WrappedTensor(t, False) for t in create_op_like(x.op, [w.t for w in x.inputs])]


@converter("TensorArrayReadV3")
def _read(x: ConversionInput):
    handle = _shared_handle(x)
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

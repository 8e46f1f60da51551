"""Converters for segment, scatter, stitch, partition and bincount ops.

One idea covers the whole family: **give every iteration its own range of segment ids (or of
output rows) and run the op once on the flattened input.**  Iteration ``i``'s segment id ``s``
becomes ``i*S + s`` where ``S`` is the per-iteration number of segments, the data is reshaped
``[n, m, ...] -> [n*m, ...]`` (free), and the ``[n*S, ...]`` result is reshaped to
``[n, S, ...]``.  Offsets keep sorted ids sorted, so the sorted ``Segment*`` kernels stay
valid, and segment sizes (for means) are unchanged.  Scatters get the iteration number as an
extra leading index coordinate instead.

- ``Segment{Sum,Mean,Max,Min,Prod}`` (which TF's own pfor lacks),
  ``UnsortedSegment{Sum,Max,Min,Prod}``, ``SparseSegment{Sum,Mean,SqrtN}[WithNumSegments]``
  and their ``...Grad`` ops: offset ids as above.
- ``TensorScatter{Update,Add,Sub,Max,Min}``, ``ScatterNd``: prepend the iteration index.
- ``DynamicStitch``/``ParallelDynamicStitch``: offset the destination indices.
- ``DynamicPartition``: partition all iterations at once; each output is split back by
  iteration.
- ``Bincount``/``DenseBincount``: one ``DenseBincount`` over ``[n, m]`` rows.

Where the number of output rows is data dependent (``Segment*`` and ``SparseSegment*`` without
``num_segments``, ``DynamicStitch``, ``DynamicPartition``), iterations that would produce
different shapes cannot be stacked: a run-time check raises an error naming the op and the
user's source line (:func:`tfx_vec.pfor.errors.runtime_message`) instead of a wrong answer.

Example:
    >>> import numpy as np, tensorflow as tf, tfx_vec
    >>> data = tf.reshape(tf.range(12.0), [2, 6])
    >>> ids = tf.constant([0, 0, 1, 1, 1, 2])
    >>> tfx_vec.pfor(lambda i: tf.math.segment_sum(tf.gather(data, i), ids), 2).numpy()
    array([[ 1.,  9.,  5.],
           [13., 27., 11.]], dtype=float32)
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import create_op_like, fold_batch, stacked, unfold_batch
from tfx_vec.pfor.converters.nn_ops import converter, split_leading
from tfx_vec.pfor.errors import runtime_message
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []


# {{{ utilities

def iteration_offsets(ids: tf.Tensor, stride: tf.Tensor) -> tf.Tensor:
    """``i * stride`` shaped ``[n, 1, ..., 1]`` to add to stacked ids ``[n, ...]``."""
    shape = tf.shape(ids)
    stride = tf.cast(stride, ids.dtype)
    steps = tf.range(tf.cast(shape[0], ids.dtype), dtype=ids.dtype) * stride
    return tf.reshape(steps, tf.concat([shape[:1], tf.ones_like(shape[1:])], 0))


def offset_ids(ids: tf.Tensor, stride: tf.Tensor, *, keep_negative: bool = True) -> tf.Tensor:
    """Stacked ids ``[n, ...]`` with iteration ``i``'s ids moved to ``[i*stride, (i+1)*stride)``.

    Negative ids (which segment ops drop) stay negative when ``keep_negative``.
    """
    shifted = ids + iteration_offsets(ids, stride)
    return tf.where(ids >= 0, shifted, ids) if keep_negative else shifted


def row_max(t: tf.Tensor) -> tf.Tensor:
    """``[n, ...] -> [n]``: the maximum of each row (the dtype's minimum for empty rows)."""
    return tf.reduce_max(tf.reshape(t, tf.stack([tf.shape(t)[0], -1])), axis=1)


def check_rows_equal(x: ConversionInput, values: tf.Tensor, what: str) -> tf.Operation:
    """A run-time assertion that every row of ``values`` equals the first one."""
    same = tf.reduce_all(tf.equal(values, values[:1]))
    return tf.debugging.Assert(same, [runtime_message(
        x.op, f"{what} differs across iterations, so the per-iteration outputs have different "
              "shapes and cannot be stacked")])


def guarded(tensors: Sequence[tf.Tensor], checks: Sequence[tf.Operation]) -> list[tf.Tensor]:
    """``tensors`` made to depend on the run-time ``checks``."""
    if not checks:
        return list(tensors)
    with tf.control_dependencies(list(checks)):
        return [tf.identity(t) for t in tensors]


def split_checked(x: ConversionInput, outs: Sequence[tf.Tensor],
                  checks: Sequence[tf.Operation]) -> list[WrappedTensor]:
    """Split each output of an op run on iteration-folded inputs back by iteration, *after*
    the run-time ``checks``: the split's reshape fails when iterations differ, and unless it
    waits for the checks it can fail first, with TF's bare shape error instead of ours."""
    outs = guarded(outs, checks)
    return stacked(*[split_leading(o, x.loop_len, like) for o, like in zip(outs, x.op.outputs)])


def flatten_rows(t: tf.Tensor) -> tf.Tensor:
    """``[n, m, ...] -> [n*m, ...]``."""
    return fold_batch(t)[0]

# }}}


# {{{ segment reductions

def _num_segments_from_ids(x: ConversionInput, ids_index: int) -> tuple[tf.Tensor, list]:
    """``S = max(ids) + 1`` over all iterations, plus the checks that every iteration agrees."""
    ids = x.input(ids_index)
    num = tf.maximum(tf.reduce_max(ids.t) + 1, 0)
    if not ids.is_stacked:
        return num, []
    return num, [check_rows_equal(x, row_max(ids.t), "the number of segments (max id + 1)")]


@converter("SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin", "SegmentProd")
def _segment(x: ConversionInput):
    num, checks = _num_segments_from_ids(x, 1)
    data = flatten_rows(x.stacked_input(0))
    ids = tf.reshape(offset_ids(x.stacked_input(1), num), [-1])
    out = create_op_like(x.op, [data, ids])[0]
    return split_checked(x, [out], checks)


@converter("UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin",
                    "UnsortedSegmentProd")
def _unsorted_segment(x: ConversionInput):
    if x.is_stacked(2):
        return None  # the output shape would differ per iteration
    num = x.input(2).t
    # ids [n, P...] is a prefix of data [n, P..., rest], so no reshape is needed at all.
    ids = offset_ids(x.stacked_input(1), num)
    total = num * tf.cast(x.loop_len, num.dtype)
    out = create_op_like(x.op, [x.stacked_input(0), ids, total])[0]
    return [WrappedTensor(split_leading(out, x.loop_len, x.op.outputs[0]), True)]


_SPARSE_SEGMENT = ("SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN")


@converter(*_SPARSE_SEGMENT, *(t + "WithNumSegments" for t in _SPARSE_SEGMENT))
def _sparse_segment(x: ConversionInput):
    with_num = x.op_type.endswith("WithNumSegments")
    if with_num and x.is_stacked(3):
        return None
    data = x.input(0)
    indices = x.stacked_input(1)
    if data.is_stacked:
        indices = offset_ids(indices, tf.shape(data.t, out_type=indices.dtype)[1])
        data_t = flatten_rows(data.t)
    else:
        data_t = data.t
    if with_num:
        num, checks = x.input(3).t, []
    else:
        num, checks = _num_segments_from_ids(x, 2)
    ids = tf.reshape(offset_ids(x.stacked_input(2), num), [-1])
    extra = [num * tf.cast(x.loop_len, num.dtype)] if with_num else []
    out = create_op_like(x.op, [data_t, tf.reshape(indices, [-1]), ids] + extra)[0]
    return split_checked(x, [out], checks)


@converter("SparseSegmentSumGrad", "SparseSegmentMeanGrad", "SparseSegmentSqrtNGrad")
def _sparse_segment_grad(x: ConversionInput):
    # (grad [S, ...], indices [k], segment_ids [k], output_dim0) -> [output_dim0, ...]
    if x.is_stacked(3):
        return None
    grad = x.stacked_input(0)
    dim0 = x.input(3).t
    num = tf.shape(grad, out_type=tf.int64)[1]
    indices = offset_ids(x.stacked_input(1), dim0)
    ids = offset_ids(x.stacked_input(2), num)
    total = dim0 * tf.cast(x.loop_len, dim0.dtype)
    out = create_op_like(x.op, [flatten_rows(grad), tf.reshape(indices, [-1]),
                                tf.reshape(ids, [-1]), total])[0]
    return [WrappedTensor(split_leading(out, x.loop_len, x.op.outputs[0]), True)]

# }}}


# {{{ scatters

def prepend_iteration_index(indices: tf.Tensor) -> tf.Tensor:
    """Stacked scatter indices ``[n, ..., d] -> [n, ..., d+1]`` with ``i`` as first coordinate."""
    shape = tf.shape(indices)
    iota = tf.reshape(tf.range(shape[0], dtype=indices.dtype),
                      tf.concat([shape[:1], tf.ones_like(shape[1:])], 0))
    iota = tf.broadcast_to(iota, tf.concat([shape[:-1], [1]], 0))
    return tf.concat([iota, indices], -1)


@converter("TensorScatterUpdate", "TensorScatterAdd", "TensorScatterSub",
                    "TensorScatterMax", "TensorScatterMin")
def _tensor_scatter(x: ConversionInput):
    indices = prepend_iteration_index(x.stacked_input(1))
    return stacked(*create_op_like(x.op, [x.stacked_input(0), indices, x.stacked_input(2)]))


@converter("ScatterNd")
def _scatter_nd(x: ConversionInput):
    if x.is_stacked(2):
        return None  # per-iteration output shapes
    shape = x.input(2).t
    n = tf.reshape(tf.cast(x.loop_len, shape.dtype), [1])
    indices = prepend_iteration_index(x.stacked_input(0))
    return stacked(*create_op_like(x.op, [indices, x.stacked_input(1), tf.concat([n, shape], 0)]))

# }}}


# {{{ stitch, partition, bincount

@converter("DynamicStitch", "ParallelDynamicStitch")
def _dynamic_stitch(x: ConversionInput):
    k = len(x.inputs) // 2
    index_inputs = x.inputs[:k]
    maxima = [row_max(w.t) if w.is_stacked else tf.reduce_max(tf.reshape(w.t, [-1]))
              for w in index_inputs]
    per_iteration_max = maxima[0]
    for m in maxima[1:]:
        per_iteration_max = tf.maximum(per_iteration_max, m)
    checks = []
    if any(w.is_stacked for w in index_inputs):
        checks.append(check_rows_equal(x, per_iteration_max, "the number of stitched rows"))
    num = tf.maximum(tf.reduce_max(per_iteration_max) + 1, 0)
    # Stacked indices [n, P...] and data [n, P..., rest] keep the op's shape contract as is.
    indices = [offset_ids(x.stacked_input(j), num) for j in range(k)]
    data = [x.stacked_input(k + j) for j in range(k)]
    out = create_op_like(x.op, indices + data)[0]
    return split_checked(x, [out], checks)


@converter("DynamicPartition")
def _dynamic_partition(x: ConversionInput):
    num_partitions = x.attr("num_partitions")
    partitions = x.input(1)
    outs = create_op_like(x.op, [x.stacked_input(0), x.stacked_input(1)])
    checks = []
    if partitions.is_stacked:
        flat = tf.reshape(partitions.t, tf.stack([tf.shape(partitions.t)[0], -1]))
        counts = tf.reduce_sum(tf.one_hot(flat, num_partitions, dtype=tf.int32), axis=1)
        checks.append(check_rows_equal(x, counts, "the size of a partition"))
    return split_checked(x, outs, checks)


def _bincount_size(x: ConversionInput) -> tuple[tf.Tensor, list]:
    """The ``size`` input; ``tf.math.bincount`` derives it from the data, so it is often
    stacked but equal in every iteration (checked at run time)."""
    size = x.input(1)
    if not size.is_stacked:
        return size.t, []
    return tf.reduce_max(size.t), [check_rows_equal(x, size.t, "the number of bins")]


@converter("Bincount")
def _bincount(x: ConversionInput):
    # (arr, size, weights): per iteration arr is any shape; weights has its shape or is empty.
    size, checks = _bincount_size(x)
    arr = x.stacked_input(0)
    rows = tf.stack([tf.shape(arr)[0], -1])
    weights = tf.reshape(x.stacked_input(2), rows) if x.op.inputs[2].shape.num_elements() != 0 \
        else x.input(2).t
    out = tf.raw_ops.DenseBincount(input=tf.reshape(arr, rows), size=size, weights=weights,
                                   binary_output=False)
    return stacked(*guarded([out], checks))


@converter("DenseBincount")
def _dense_bincount(x: ConversionInput):
    # (input [m] or [b, m], size, weights same shape or empty): rows are counted independently.
    rank = x.op.inputs[0].shape.rank
    if rank is None:
        return None
    size, checks = _bincount_size(x)
    has_weights = x.op.inputs[2].shape.num_elements() != 0
    arr, weights = x.stacked_input(0), x.stacked_input(2) if has_weights else x.input(2).t
    lead = None
    if rank == 2:
        arr, lead = fold_batch(arr)
        weights = fold_batch(weights)[0] if has_weights else weights
    out = tf.raw_ops.DenseBincount(input=arr, size=size, weights=weights,
                                   binary_output=x.attr("binary_output"))
    out = guarded([out], checks)[0]  # before unfold_batch's reshape (see split_checked)
    return stacked(out if lead is None else unfold_batch(out, lead))

# }}}

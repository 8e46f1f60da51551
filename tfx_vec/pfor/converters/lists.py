"""Converters for TensorLists (what ``tf.TensorArray``, ``tf.map_fn``, ``tf.scan`` and the
accumulators of while-loop gradients are made of).

Layout: a loop-variant list is ONE list whose elements carry the batch axis (element ``k`` of
the vectorized list is ``[n, *element_shape]``, row ``i`` being element ``k`` of iteration
``i``'s list), so pushing, popping and indexing with a loop-invariant index stay single ops.
A loop-invariant list is the original list.  An invariant list that must become stacked (an
iteration-dependent write) is tiled element-wise by :func:`tile_list`.

A loop-variant *index* is served by stacking the list to a ``[length, n, ...]`` tensor and
gathering per iteration; writes at a loop-variant index are declined (per-iteration fallback).

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> def body(i):
    ...     ta = tf.TensorArray(tf.float32, size=3)
    ...     for k in range(3):
    ...         ta = ta.write(k, tf.cast(i * k, tf.float32))
    ...     return ta.stack()
    >>> tfx_vec.pfor(body, 2).numpy().tolist()
    [[0.0, 0.0, 0.0], [0.0, 1.0, 2.0]]
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_list_ops, handle_data_util, list_ops

from tfx_vec.pfor.registry import (ConversionInput, WrappedTensor, register_converter,
                                   tile_to_stacked)


# {{{ helpers

def _dtype(x: ConversionInput) -> tf.DType:
    return x.attr("element_dtype")


def _static_shape(shape: tf.Tensor):
    """The element shape as a list (None for unknown dims), or None if the rank is unknown."""
    v = tf.get_static_value(shape)
    if v is None:
        return None
    v = np.asarray(v)
    if v.ndim == 0:
        return None  # -1: unknown rank
    return [None if d < 0 else int(d) for d in v.reshape(-1)]


def _stacked_element_shape(shape: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """Element shape for the stacked list: ``[n, *shape]``, or -1 (unknown) when partial."""
    dims = _static_shape(shape)
    if dims is None or any(d is None for d in dims):
        return tf.constant(-1, tf.int32)
    return tf.concat([tf.reshape(tf.cast(n, tf.int32), [1]), tf.constant(dims, tf.int32)], 0)


def _list_element_shape(handle: tf.Tensor):
    """Per-iteration element shape from a list's handle data (None when unknown)."""
    try:
        data = handle_data_util.get_resource_handle_data(handle)
        if data.is_set and data.shape_and_type:
            shape = tf.TensorShape(data.shape_and_type[0].shape)
            if shape.is_fully_defined():
                return shape
    except Exception:  # no handle data: not known statically
        pass
    return None


def transpose01(t: tf.Tensor) -> tf.Tensor:
    perm = tf.concat([[1, 0], tf.range(2, tf.rank(t))], 0)
    return tf.transpose(t, perm)


_FRESH = ("TensorListReserve", "EmptyTensorList")


def tile_list(handle: tf.Tensor, n: tf.Tensor, dtype: tf.DType,
              element_shape: tf.Tensor | None = None, fresh: bool = False) -> tf.Tensor:
    """An invariant list -> the stacked layout (every element tiled to ``[n, ...]``).

    ``fresh``: the list was just created (``TensorListReserve``/``EmptyTensorList``), so no
    element is set and the stacked list is a new list of the same length.  Otherwise the
    elements are stacked with ``element_shape`` (per iteration; default: the list's handle
    data), so unset elements become zeros, what reading them would give; a list of unknown
    element shape must then have every element set.
    """
    length = list_ops.tensor_list_length(handle)
    if fresh:
        return list_ops.tensor_list_reserve(tf.constant(-1, tf.int32), length, dtype)
    if element_shape is None:
        static = _list_element_shape(handle)
        element_shape = (tf.constant(static.as_list(), tf.int32) if static is not None
                         else tf.constant(-1, tf.int32))
    dense = list_ops.tensor_list_stack(handle, dtype, element_shape=element_shape)
    rep = tf.concat([[1], tf.reshape(tf.cast(n, tf.int32), [1]),
                     tf.ones([tf.rank(dense) - 1], tf.int32)], 0)
    return list_ops.tensor_list_from_tensor(tf.tile(tf.expand_dims(dense, 1), rep),
                                            tf.constant(-1, tf.int32))


def _stacked_list(x: ConversionInput, i: int = 0, item: int | None = None) -> tf.Tensor:
    """Input ``i`` (a list) in the stacked layout; ``item``: input giving the element shape."""
    w = x.inputs[i]
    if w.is_stacked:
        return w.t
    fresh = x.op.inputs[i].op.type in _FRESH
    shape = None
    if item is not None and not fresh:
        it = x.inputs[item]
        shape = tf.shape(it.t)[1:] if it.is_stacked else tf.shape(it.t)
    return tile_list(w.t, x.loop_len, _dtype(x), shape, fresh)


def _per_iteration_lists(x: ConversionInput) -> bool:
    """Whether some input is a vector of per-iteration lists (a fallback's output), which
    only the per-iteration fallback handles."""
    return any(w.is_stacked and w.t.dtype == tf.variant and w.t.shape.rank != 0
               for w in x.inputs)


def restore_shapes(x: ConversionInput, outs):
    """Give stacked results the original outputs' static per-iteration shapes."""
    for w, o in zip(outs or [], x.op.outputs):
        if w.is_stacked and o.dtype != tf.variant:
            w.t.set_shape(tf.TensorShape([None]).concatenate(o.shape))
    return outs


def list_converter(*op_types: str):
    """``register_converter`` for list ops, declining vectors of per-iteration lists.

    Elements read from a list often have no static shape (the list's element shape is
    unknown); the original op's output shape is restored on the stacked result, so that the
    ops consuming it (e.g. broadcasting ones) still know their ranks.
    """
    def decorate(fn):
        def converter(x: ConversionInput):
            if _per_iteration_lists(x):
                return None
            return restore_shapes(x, fn(x))
        converter.__name__ = fn.__name__
        register_converter(*op_types)(converter)
        return fn
    return decorate


def _item(x: ConversionInput, i: int) -> tf.Tensor:
    return x.stacked_input(i)


def _out(t: tf.Tensor, stacked: bool = True) -> WrappedTensor:
    return WrappedTensor(t, stacked)

# }}}


@list_converter("TensorListFromTensor")
def _from_tensor(x: ConversionInput):
    t = x.stacked_input(0)  # [n, L, *S]
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    return [_out(list_ops.tensor_list_from_tensor(transpose01(t), shape))]


@list_converter("TensorListStack")
def _stack(x: ConversionInput):
    handle = _stacked_list(x)
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    dense = list_ops.tensor_list_stack(handle, _dtype(x), element_shape=shape,
                                       num_elements=x.attr("num_elements"))
    return [_out(transpose01(dense))]


@list_converter("TensorListLength")
def _length(x: ConversionInput):
    return [_out(list_ops.tensor_list_length(x.inputs[0].t), False)]


@list_converter("TensorListElementShape")
def _element_shape(x: ConversionInput):
    shape = list_ops.tensor_list_element_shape(x.inputs[0].t, x.attr("shape_type"))
    return [_out(tf.cond(tf.rank(shape) > 0, lambda: shape[1:], lambda: shape), False)]


@list_converter("TensorListGetItem")
def _get_item(x: ConversionInput):
    handle, index = x.inputs[0], x.inputs[1]
    dtype = _dtype(x)
    if handle.is_stacked and not index.is_stacked:
        shape = _stacked_element_shape(x.unstacked_input(2), x.loop_len)
        return [_out(list_ops.tensor_list_get_item(handle.t, index.t, dtype, shape))]
    if not handle.is_stacked:  # invariant list, per-iteration index: one gather
        return [_out(list_ops.tensor_list_gather(handle.t, index.t, dtype,
                                                 element_shape=x.unstacked_input(2)))]
    dense = transpose01(list_ops.tensor_list_stack(handle.t, dtype))  # [n, L, *S]
    return [_out(tf.gather(dense, index.t, batch_dims=1))]


@list_converter("TensorListGather")
def _gather(x: ConversionInput):
    handle, indices = x.inputs[0], x.inputs[1]
    dtype = _dtype(x)
    if not handle.is_stacked:
        dense = list_ops.tensor_list_stack(handle.t, dtype, element_shape=x.unstacked_input(2))
        return [_out(tf.gather(dense, indices.t))]
    dense = transpose01(list_ops.tensor_list_stack(handle.t, dtype))  # [n, L, *S]
    if indices.is_stacked:
        return [_out(tf.gather(dense, indices.t, batch_dims=1))]
    return [_out(tf.gather(dense, indices.t, axis=1))]


@list_converter("TensorListSetItem")
def _set_item(x: ConversionInput):
    if x.is_stacked(1):
        return None  # writes at iteration-dependent positions: per-iteration fallback
    handle = _stacked_list(x, 0, item=2)
    attrs = x.op.node_def.attr
    resize = "resize_if_index_out_of_bounds" in attrs and attrs["resize_if_index_out_of_bounds"].b
    kw = {"resize_if_index_out_of_bounds": True} if resize else {}
    out = gen_list_ops.tensor_list_set_item(handle, x.inputs[1].t, _item(x, 2), **kw)
    return [_out(out)]


@list_converter("TensorListPushBack")
def _push_back(x: ConversionInput):
    handle = _stacked_list(x, 0, item=1)
    return [_out(list_ops.tensor_list_push_back(handle, _item(x, 1)))]


@list_converter("TensorListPopBack")
def _pop_back(x: ConversionInput):
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    handle, item = gen_list_ops.tensor_list_pop_back(x.inputs[0].t, shape, _dtype(x))
    return [_out(handle), _out(item)]


@list_converter("TensorListScatterIntoExistingList")
def _scatter_existing(x: ConversionInput):
    if x.is_stacked(2):
        return None
    handle = _stacked_list(x)
    tensor = transpose01(x.stacked_input(1))  # [k, n, *S]
    return [_out(list_ops.tensor_list_scatter(tensor, x.inputs[2].t, input_handle=handle))]


@list_converter("TensorListScatterV2", "TensorListScatter")
def _scatter(x: ConversionInput):
    if x.is_stacked(2) or any(w.is_stacked for w in x.inputs[3:]):
        return None
    tensor = transpose01(x.stacked_input(0))
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    rest = [w.t for w in x.inputs[3:]]
    out = list_ops.tensor_list_scatter(tensor, x.inputs[2].t, element_shape=shape,
                                       num_elements=rest[0] if rest else None)
    return [_out(out)]


@list_converter("TensorListReserve", "EmptyTensorList")
def _reserve(x: ConversionInput):
    raise x.error("the length of a TensorArray/TensorList depends on the loop index; pfor "
                  "needs the same length in every iteration")


@list_converter("TensorListResize")
def _resize(x: ConversionInput):
    if x.is_stacked(1):
        return None
    return [_out(list_ops.tensor_list_resize(_stacked_list(x), x.inputs[1].t))]


def stack_like(w: WrappedTensor, n: tf.Tensor, original: tf.Tensor | None = None) -> tf.Tensor:
    """``w`` in the stacked layout: tiled for tensors, :func:`tile_list` for lists.

    ``original`` (the value in the loop-body graph) tells whether a list is freshly created.
    """
    if w.is_stacked:
        return w.t
    if w.t.dtype == tf.variant:
        fresh = original is not None and original.op.type in _FRESH
        return tile_list(w.t, n, handle_dtype(w.t), fresh=fresh)
    filled = _fill_stacked(w.t, n)
    return filled if filled is not None else tile_to_stacked(w.t, n)


def _fill_stacked(t: tf.Tensor, n: tf.Tensor) -> tf.Tensor | None:
    """A constant-filled invariant value (``Fill``, ``ZerosLike``, ``OnesLike`` or a uniform
    ``Const``: e.g. the zero initial value of a while-loop gradient accumulator) stacked by
    filling ``[n, ...]`` directly, which writes the result once instead of reading it back
    as ``Tile`` does (the accumulators of per-example weight gradients are
    ``[n, *weight.shape]``).  None when ``t`` is not such a value."""
    kind = getattr(getattr(t, "op", None), "type", None)  # eager tensors have no op
    lead = tf.reshape(tf.cast(n, tf.int32), [1])
    if kind == "Fill":
        dims, value = t.op.inputs
        return tf.fill(tf.concat([lead, tf.cast(dims, tf.int32)], 0), value)
    if kind in ("ZerosLike", "OnesLike"):
        shape = tf.concat([lead, tf.shape(t.op.inputs[0], out_type=tf.int32)], 0)
        return (tf.zeros if kind == "ZerosLike" else tf.ones)(shape, t.dtype)
    if kind == "Const" and (t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_bool):
        v = np.asarray(tf.get_static_value(t))
        if v.size < 2 or not _uniform(v):
            return None
        dims = tf.constant(v.shape, tf.int32)
        return tf.fill(tf.concat([lead, dims], 0), tf.constant(v.flat[0], t.dtype))
    return None


def _uniform(v: np.ndarray) -> bool:
    """All elements equal, bit for bit where it matters (NaN never, -0.0 is not 0.0)."""
    first = v.flat[0]
    same = np.all(v == first)
    if same and v.dtype.kind == "f":
        same = np.all(np.signbit(v) == np.signbit(first))
    return bool(same)


def handle_dtype(handle: tf.Tensor) -> tf.DType:
    """The element dtype of a TensorList, from its handle data."""
    data = handle_data_util.get_resource_handle_data(handle)
    if data.is_set and data.shape_and_type:
        return tf.as_dtype(data.shape_and_type[0].dtype)
    raise ValueError(f"cannot tell the element dtype of the TensorList {handle.name}")

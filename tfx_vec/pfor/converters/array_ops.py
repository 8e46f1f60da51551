"""Converters for shape-manipulation and indexing ops (paper §3.4: renumber axes, fold batch).

Shape-like operands (``shape``, ``axis``, ``perm``, ``begin``, ...) must be loop-invariant for
the vectorized form; when they depend on the loop index the converter returns None and the
op runs in the per-iteration fallback (which checks that all iterations agree in shape).

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> x = tf.reshape(tf.range(24), [2, 3, 4])
    >>> tfx_vec.pfor(lambda i: tf.transpose(tf.gather(x, i))[1:, ::2], 2).shape
    TensorShape([2, 3, 2])
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (assert_same_across, batch_folding, create_op_like,
                                              elementwise, fold_batch, same_shape, unfold_batch,
                                              expand_after_batch, loop_len_static, move_axis,
                                              per_iteration_rank, reemit_stacked, shift_axis,
                                              stacked, static_value)
from tfx_vec.pfor.errors import runtime_message
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []

elementwise("MatrixDiag", "MatrixDiagPart", "Bucketize", "RGBToHSV", "HSVToRGB",
            "AdjustContrastv2", "AdjustHue", "AdjustSaturation")
same_shape("Cross")
batch_folding("SpaceToDepth", "DepthToSpace", "ResizeBilinear", "ResizeNearestNeighbor",
              "ResizeBicubic", "ResizeArea", "ExtractImagePatches", "Dilation2D")


def _shifted(axis) -> tf.Tensor:
    out = shift_axis(axis)
    return tf.constant(out) if isinstance(out, np.ndarray) else out


def _n(x: ConversionInput, t: tf.Tensor) -> tf.Tensor:
    """Leading (batch) dimension of a stacked value, static when known."""
    return t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]


def _with_batch(x: ConversionInput, shape: tf.Tensor) -> tf.Tensor:
    """``[n, *shape]`` for a shape vector (a constant when both are static)."""
    n, value = static_value(x.loop_len), static_value(shape) if isinstance(shape, tf.Tensor) \
        else np.asarray(shape)
    if n is not None and value is not None:
        return tf.constant(np.concatenate([[int(n)], np.asarray(value).reshape(-1)])
                           .astype(np.asarray(value).dtype if np.asarray(value).size else np.int32))
    shape = tf.convert_to_tensor(shape)
    return tf.concat([tf.reshape(tf.cast(x.loop_len, shape.dtype), [1]), shape], 0)


# {{{ reshape family

@register_converter("Reshape")
def _reshape(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    t = x.stacked_input(0)
    return stacked(tf.reshape(t, _with_batch(x, x.input(1).t)))


@register_converter("ExpandDims")
def _expand_dims(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    return reemit_stacked(x, [x.input(0).t, _shifted(x.input(1).t)])


@register_converter("Squeeze")
def _squeeze(x: ConversionInput):
    dims = list(x.attr("squeeze_dims"))
    if not dims:  # squeeze every size-1 axis: must be known statically, never the batch axis
        shape = x.op.inputs[0].shape
        if not shape.is_fully_defined():
            return None
        dims = [k for k, d in enumerate(shape.as_list()) if d == 1]
    new = [d + 1 if d >= 0 else d for d in dims]
    return stacked(tf.squeeze(x.input(0).t, axis=new) if new else x.input(0).t)


@register_converter("Transpose", "ConjugateTranspose")
def _transpose(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    perm, rank = x.input(1).t, per_iteration_rank(x.input(0))
    value = static_value(perm)
    if value is not None:
        value = np.asarray(value)
        new_perm = tf.constant(np.concatenate([[0], np.where(value < 0, value + rank, value) + 1])
                               .astype(value.dtype)) if rank is not None or not len(value) else None
        if new_perm is None:
            return None
    else:
        r = tf.cast(tf.size(perm), perm.dtype)
        new_perm = tf.concat([tf.zeros([1], perm.dtype), tf.where(perm < 0, perm + r, perm) + 1], 0)
    return reemit_stacked(x, [x.input(0).t, new_perm])


@register_converter("BroadcastTo")
def _broadcast_to(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    shape = x.input(1).t
    target_rank = shape.shape[0] if shape.shape.rank == 1 else None
    rank = per_iteration_rank(x.input(0))
    if target_rank is None or rank is None:
        return None
    t = expand_after_batch(x.input(0).t, target_rank - rank)
    return stacked(tf.broadcast_to(t, _with_batch(x, shape)))


@register_converter("BroadcastArgs")
def _broadcast_args(x: ConversionInput):
    s0, s1 = x.stacked_input(0), x.stacked_input(1)
    a, b = s0.shape[1], s1.shape[1]
    if a is None or b is None:
        return None
    m = max(a, b)
    pad = lambda s, k: tf.pad(s, [[0, 0], [m - k, 0]], constant_values=1)  # noqa: E731
    s0, s1 = pad(s0, a), pad(s1, b)
    return stacked(tf.where(tf.equal(s0, 1), s1, s0))

# }}}

# {{{ joining and splitting


@register_converter("ConcatV2")
def _concat(x: ConversionInput):
    n = len(x.inputs) - 1
    if not x.require_invariant(n):
        return None
    values = [x.stacked_input(i) for i in range(n)]
    return stacked(tf.concat(values, axis=_shifted(x.input(n).t)))


@register_converter("Concat")
def _concat_v1(x: ConversionInput):
    if not x.require_invariant(0):
        return None
    values = [x.stacked_input(i) for i in range(1, len(x.inputs))]
    return stacked(tf.concat(values, axis=_shifted(x.input(0).t)))


@register_converter("Pack")
def _pack(x: ConversionInput):
    axis = x.attr("axis")
    values = [x.stacked_input(i) for i in range(len(x.inputs))]
    return stacked(tf.stack(values, axis=axis + 1 if axis >= 0 else axis))


@register_converter("Unpack")
def _unpack(x: ConversionInput):
    axis = x.attr("axis")
    return reemit_stacked(x, [x.input(0).t], attrs={"axis": axis + 1 if axis >= 0 else axis})


@register_converter("Split")
def _split(x: ConversionInput):
    if not x.require_invariant(0):
        return None
    return reemit_stacked(x, [_shifted(x.input(0).t), x.input(1).t])


@register_converter("SplitV")
def _split_v(x: ConversionInput):
    if not x.require_invariant(1, 2):
        return None
    return reemit_stacked(x, [x.input(0).t, x.input(1).t, _shifted(x.input(2).t)])


@register_converter("Tile")
def _tile(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    m = x.input(1).t
    return reemit_stacked(x, [x.input(0).t, tf.concat([tf.ones([1], m.dtype), m], 0)])


@register_converter("Pad", "PadV2", "MirrorPad")
def _pad(x: ConversionInput):
    if not x.require_invariant(*range(1, len(x.inputs))):
        return None
    p = x.input(1).t
    inputs = [x.input(0).t, tf.concat([tf.zeros([1, 2], p.dtype), p], 0)]
    inputs += [w.t for w in x.inputs[2:]]
    return reemit_stacked(x, inputs)

# }}}

# {{{ slicing and gathering


@register_converter("Slice")
def _slice(x: ConversionInput):
    if not x.require_invariant(2):
        return None
    if x.is_stacked(1):  # loop-variant offsets: gather the windows
        begin, size = x.input(1).t, static_value(x.input(2).t)
        if size is None:
            return None
        axes = []
        for k, sz in enumerate(np.asarray(size).reshape(-1).tolist()):
            def bounds(dim, k=k, sz=sz):
                b = begin[:, k]
                return b, (dim - b if sz < 0 else tf.fill(tf.shape(b), tf.cast(sz, b.dtype)))
            axes.append((k, 1, False, bounds))
        return _gather_ranges(x, axes, begin.dtype)
    begin, size = x.input(1).t, x.input(2).t
    begin = tf.concat([tf.zeros([1], begin.dtype), begin], 0)
    size = tf.concat([-tf.ones([1], size.dtype), size], 0)
    return reemit_stacked(x, [x.input(0).t, begin, size])


@register_converter("StridedSlice")
def _strided_slice(x: ConversionInput):
    """Prepend a full slice ``[:]`` for the batch axis; every mask moves one bit left.

    Loop-variant ``begin``/``end`` (``x[i]``, ``x[i:i+k]``) become per-iteration gathers.
    """
    if not x.require_invariant(3):
        return None
    if not x.require_invariant(1, 2):   # the reason, should the gather form decline too
        return _strided_slice_by_gather(x)
    begin, end, strides = (x.input(i).t for i in (1, 2, 3))

    def one(t, v):
        value = static_value(t)
        if value is not None:
            return tf.constant(np.concatenate([[v], value]).astype(value.dtype))
        return tf.concat([tf.fill([1], tf.cast(v, t.dtype)), t], 0)
    attrs = {m: x.attr(m) << 1 for m in ("begin_mask", "end_mask", "ellipsis_mask",
                                          "new_axis_mask", "shrink_axis_mask")}
    attrs["begin_mask"] |= 1
    attrs["end_mask"] |= 1
    return reemit_stacked(x, [x.input(0).t, one(begin, 0), one(end, 0), one(strides, 1)],
                          attrs=attrs)


def _strided_slice_by_gather(x: ConversionInput):
    """``x[b_i:e_i:s]`` with loop-variant bounds: gather ``b_i + s*range(size)`` per axis.

    Every iteration must select the same number of elements (checked at run time).  Only
    positive constant strides and no ellipsis / new axes (otherwise: per-iteration fallback).
    """
    strides = static_value(x.input(3).t)
    if strides is None or np.any(np.asarray(strides) <= 0) or x.attr("ellipsis_mask") or \
            x.attr("new_axis_mask"):
        return None
    begin, end = x.stacked_input(1), x.stacked_input(2)
    begin_mask, end_mask, shrink = (x.attr(m) for m in ("begin_mask", "end_mask",
                                                        "shrink_axis_mask"))
    axes = []
    for k, stride in enumerate(np.asarray(strides).reshape(-1).tolist()):
        bit = 1 << k
        if begin_mask & bit and end_mask & bit and stride == 1 and not shrink & bit:
            continue  # a full ``:`` along this axis

        def bounds(dim, k=k, bit=bit, stride=stride):
            b = tf.zeros_like(begin[:, k]) if begin_mask & bit else begin[:, k]
            b = tf.clip_by_value(tf.where(b < 0, b + dim, b), 0, dim)
            if shrink & bit:
                return b, None
            e = tf.fill(tf.shape(b), dim) if end_mask & bit else end[:, k]
            e = tf.clip_by_value(tf.where(e < 0, e + dim, e), 0, dim)
            return b, tf.maximum((e - b + stride - 1) // stride, 0)
        axes.append((k, stride, bool(shrink & bit), bounds))
    return _gather_ranges(x, axes, begin.dtype)


def _gather_ranges(x: ConversionInput, axes, dtype):
    """Gather ``start_i + stride*range(size)`` along each listed per-iteration axis.

    ``axes``: (axis, stride, squeeze, bounds) with ``bounds(dim) -> (starts [n], sizes [n] or
    None for one element)``; sizes must agree across iterations (run-time check).
    """
    value = x.input(0)
    t, t_stacked = value.t, value.is_stacked
    squeeze = []
    for k, stride, drop, bounds in axes:
        axis = k + 1 if t_stacked else k
        b, sizes = bounds(tf.cast(tf.shape(t)[axis], dtype))
        size = tf.ones([], dtype) if sizes is None else assert_same_across(
            x, sizes, "slice lengths differ across iterations")
        idx = b[:, None] + stride * tf.range(size, dtype=dtype)[None, :]   # [n, size]
        if t_stacked:
            t = tf.gather(t, idx, axis=axis, batch_dims=1)
        else:
            t = move_axis(tf.gather(t, idx, axis=axis), axis, 0)
            t_stacked = True
        if drop:
            squeeze.append(k + 1)
    if not t_stacked:
        return None
    return stacked(tf.squeeze(t, squeeze) if squeeze else t)


@register_converter("Gather", "GatherV2")
def _gather(x: ConversionInput):
    params, indices = x.input(0), x.input(1)
    if x.op_type == "GatherV2":
        if not x.require_invariant(2):
            return None
        axis = static_value(x.input(2).t)
        batch_dims = x.attr("batch_dims")
    else:
        axis, batch_dims = 0, 0
    if axis is None:
        return x.decline("the gather axis is not known when the graph is built")
    axis = int(axis)
    p_rank, i_rank = per_iteration_rank(params), per_iteration_rank(indices)
    if batch_dims < 0:
        if i_rank is None:
            return x.decline("negative batch_dims with indices of unknown rank")
        batch_dims += i_rank
    if p_rank is not None and p_rank:
        axis %= p_rank
    if params.is_stacked and not indices.is_stacked and batch_dims == 0:
        return stacked(tf.gather(params.t, indices.t, axis=axis + 1 if axis >= 0 else axis))
    if indices.is_stacked and not params.is_stacked and batch_dims == 0:
        if axis == 0 and _is_loop_counter(x, indices.t):
            # gather(params, i) with i the loop index: the first n rows, a slice (XLA:CPU's
            # gather copies them element by element, 2x slower than the slice).
            rank = params.t.shape.rank
            if rank is not None:
                rows = tf.slice(params.t, [0] * rank,
                                tf.concat([[x.loop_len], -tf.ones([rank - 1], tf.int32)], 0))
                rows.set_shape([loop_len_static(x)] + params.t.shape.as_list()[1:])
                return stacked(rows)
        out = tf.gather(params.t, indices.t, axis=axis)  # [*p[:axis], n, *i, *p[axis+1:]]
        if axis == 0:
            return stacked(out)
        if p_rank is None:
            return stacked(_move_to_front(out, axis if axis >= 0 else axis + tf.rank(params.t)))
        return stacked(move_axis(out, axis, 0))
    # (a negative axis counts from the end, batch axis or not)
    return stacked(tf.gather(x.stacked_input(0), x.stacked_input(1),
                             axis=axis + 1 if axis >= 0 else axis, batch_dims=batch_dims + 1))


def _is_loop_counter(x: ConversionInput, t: tf.Tensor) -> bool:
    """Is ``t`` (a stacked value) ``tf.range(loop_len)``, the loop index of ``pfor``?"""
    if t.op.type != "Range" or static_value(t.op.inputs[0]) != 0 \
            or static_value(t.op.inputs[2]) != 1:
        return False
    limit, n = t.op.inputs[1], tf.convert_to_tensor(x.loop_len)
    static_n = static_value(n)
    return limit is n or (static_n is not None and static_value(limit) == static_n)


def _move_to_front(t: tf.Tensor, axis) -> tf.Tensor:
    """Move axis ``axis`` (a scalar, possibly a tensor) of ``t`` (any rank) to the front."""
    r = tf.rank(t)
    perm = tf.concat([tf.reshape(axis, [1]), tf.range(axis), tf.range(axis + 1, r)], 0)
    return tf.transpose(t, perm)


@register_converter("GatherNd")
def _gather_nd(x: ConversionInput):
    params, indices = x.input(0), x.input(1)
    if indices.is_stacked and not params.is_stacked:
        return stacked(tf.gather_nd(params.t, indices.t))
    return stacked(tf.gather_nd(x.stacked_input(0), x.stacked_input(1), batch_dims=1))


@register_converter("ReverseV2")
def _reverse_v2(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    return reemit_stacked(x, [x.input(0).t, _shifted(x.input(1).t)])


@register_converter("Reverse")
def _reverse(x: ConversionInput):
    if not x.require_invariant(1):
        return None
    dims = x.input(1).t
    return reemit_stacked(x, [x.input(0).t, tf.concat([tf.zeros([1], tf.bool), dims], 0)])


@register_converter("Roll")
def _roll(x: ConversionInput):
    if not x.require_invariant(2):
        return None
    if not x.is_stacked(1):
        return reemit_stacked(x, [x.stacked_input(0), x.input(1).t, _shifted(x.input(2).t)])
    return _roll_per_iteration_shift(x)


def _roll_per_iteration_shift(x: ConversionInput):
    """Each iteration's own shift: rolling axis ``a`` by ``s_i`` is a gather of positions
    ``(j - s_i) mod L`` along it, one batched gather per rolled axis (repeated axes add up)."""
    axes = static_value(x.input(2).t)
    rank = per_iteration_rank(x.input(0))
    if axes is None or rank is None:
        return x.decline("a per-iteration roll shift needs constant axes and a known rank")
    axes = [int(a) % rank for a in np.asarray(axes).reshape(-1)]
    t = x.stacked_input(0)
    shift = tf.reshape(x.input(1).t, [-1, len(axes)]) if axes else None
    totals: dict[int, tf.Tensor] = {}
    for k, a in enumerate(axes):
        totals[a] = totals[a] + shift[:, k] if a in totals else shift[:, k]
    for a, s in totals.items():
        length = tf.shape(t, out_type=s.dtype)[a + 1]
        pos = tf.math.floormod(tf.range(length)[None, :] - s[:, None], length)   # [n, L]
        t = tf.gather(t, pos, axis=a + 1, batch_dims=1)
    return stacked(t)

# }}}

# {{{ sorting: searchsorted


@register_converter("LowerBound", "UpperBound")
def _search_sorted(x: ConversionInput):
    """``(sorted [B, N], values [B, M])``.  An invariant sorted input keeps its B rows: the
    iterations' values become ``n*M`` more values per row; otherwise the iterations fold into
    the batch rows."""
    sorted_in, values = x.input(0), x.input(1)
    if x.vectorizer.xla and x.op.inputs[0].shape[-1] is not None:
        return stacked(_binary_search(x))
    if not sorted_in.is_stacked:
        moved = move_axis(values.t, 0, 1)                          # [B, n, M]
        shape = tf.shape(moved)
        flat = tf.reshape(moved, tf.stack([shape[0], shape[1] * shape[2]]))
        out = create_op_like(x.op, [sorted_in.t, flat])[0]
        return stacked(move_axis(tf.reshape(out, shape), 1, 0))
    folded_sorted, lead = fold_batch(x.stacked_input(0))
    folded_values, _ = fold_batch(x.stacked_input(1))
    out = create_op_like(x.op, [folded_sorted, folded_values])[0]
    return stacked(unfold_batch(out, lead))

#: Fan-out of the blocked search: each level compares a value with 16 block boundaries.
_SEARCH_FANOUT = 16


def _binary_search(x: ConversionInput) -> tf.Tensor:
    """searchsorted under XLA as a search down a tree of blocks: XLA lowers
    ``LowerBound``/``UpperBound`` to an ``N x M`` comparison, which the iterations multiply.

    The sorted row is padded to ``16**L`` entries (with the dtype's largest value; results
    are clipped to ``N``); level ``l`` compares each value with the last entries of the 16
    sub-blocks of its current block and counts those below it (``<=`` for ``UpperBound``),
    which picks the sub-block.  That is ``L = ceil(log16(N))`` gathers of 16 entries, where a
    binary search's ``log2(N)`` dependent steps fuse into XLA:CPU loops that recompute every
    earlier step (3.5x slower for ``N = 4096``).  An invariant sorted input is searched as it is,
    with the iterations' values as more values per row.
    """
    if x.is_stacked(0):
        sorted_in, values = fold_batch(x.stacked_input(0))[0], fold_batch(x.stacked_input(1))[0]
        shape = tf.shape(x.stacked_input(1))
        restore = lambda t: tf.reshape(t, shape)  # noqa: E731
    else:
        sorted_in, moved = x.input(0).t, move_axis(x.input(1).t, 0, 1)  # [B, N], [B, n, M]
        shape = tf.shape(moved)
        values = tf.reshape(moved, tf.stack([shape[0], shape[1] * shape[2]]))  # [B, n*M]
        restore = lambda t: move_axis(tf.reshape(t, shape), 1, 0)  # noqa: E731
    size, f = int(x.op.inputs[0].shape[-1]), _SEARCH_FANOUT
    levels = max(1, int(np.ceil(np.log(max(size, 1)) / np.log(f) - 1e-9)))
    top = sorted_in.dtype.max if sorted_in.dtype.is_integer else np.inf
    padded = tf.pad(sorted_in, [[0, 0], [0, f ** levels - size]], constant_values=top)
    below = (lambda s, v: s <= v) if x.op_type == "UpperBound" else (lambda s, v: s < v)
    lead = None                                        # [B, K]: block index so far
    for level in range(levels):
        block = f ** (levels - 1 - level)              # entries per sub-block at this level
        if lead is None:                               # the same 16 boundaries for every value
            bounds = padded[:, block - 1::block][:, None, :]                  # [B, 1, f]
        else:
            at = (lead[..., None] * f + tf.range(f)) * block + (block - 1)
            bounds = tf.gather(padded, at, batch_dims=1)                      # [B, K, f]
        count = tf.reduce_sum(tf.cast(below(bounds, values[..., None]), tf.int32), -1)
        if level < levels - 1:
            count = tf.minimum(count, f - 1)
        lead = count if lead is None else lead * f + count
    return restore(tf.cast(tf.minimum(lead, size), x.attr("out_type")))


# {{{ creation


@register_converter("Fill")
def _fill(x: ConversionInput):
    if not x.require_invariant(0):
        return None
    dims, value = x.input(0).t, x.input(1).t          # value: stacked [n]
    k = tf.size(dims)
    v = tf.reshape(value, tf.concat([tf.shape(value)[:1], tf.ones([k], tf.int32)], 0))
    out = tf.broadcast_to(v, _with_batch(x, tf.cast(dims, tf.int32)))
    return stacked(out)


@register_converter("OneHot")
def _one_hot(x: ConversionInput):
    if not x.require_invariant(1, 2, 3):
        return None
    axis = x.attr("axis")
    return reemit_stacked(x, [w.t for w in x.inputs], attrs={"axis": axis + 1 if axis >= 0
                                                             else axis})


@register_converter("Range")
def _range(x: ConversionInput):
    """Every iteration's range must have the same length (checked at run time)."""
    start, limit, delta = (x.stacked_input(i) for i in range(3))
    dtype = x.op.outputs[0].dtype
    if dtype.is_integer:
        size = (tf.abs(limit - start) + tf.abs(delta) - 1) // tf.abs(delta)
        size = tf.where((limit - start) * delta > 0, size, tf.zeros_like(size))
    else:
        size = tf.maximum(tf.math.ceil((limit - start) / delta), 0)
    size = tf.cast(size, tf.int32)
    size0 = assert_same_across(x, size, "tf.range lengths differ across iterations")
    steps = tf.cast(tf.range(size0), dtype)
    return stacked(start[:, None] + delta[:, None] * steps[None, :])


@register_converter("LinSpace")
def _linspace(x: ConversionInput):
    if not x.require_invariant(2):
        return None
    start, stop = x.stacked_input(0), x.stacked_input(1)
    return stacked(tf.linspace(start, stop, x.input(2).t, axis=1))

# }}}

# {{{ shapes (the per-iteration shape is the same in every iteration)


def _per_iteration_shape(w: WrappedTensor, out_type) -> tf.Tensor:
    s = tf.shape(w.t, out_type=out_type)
    return s[1:] if w.is_stacked else s


@register_converter("Shape")
def _shape(x: ConversionInput):
    return WrappedTensor(_per_iteration_shape(x.input(0), x.attr("out_type")), False)


@register_converter("ShapeN")
def _shape_n(x: ConversionInput):
    return [WrappedTensor(_per_iteration_shape(w, x.attr("out_type")), False) for w in x.inputs]


@register_converter("Size")
def _size(x: ConversionInput):
    s = _per_iteration_shape(x.input(0), x.attr("out_type"))
    return WrappedTensor(tf.reduce_prod(s), False)


@register_converter("Rank")
def _rank(x: ConversionInput):
    return WrappedTensor(tf.rank(x.input(0).t) - 1, False)


@register_converter("IdentityN")
def _identity_n(x: ConversionInput):
    return [WrappedTensor(tf.identity(w.t), w.is_stacked) for w in x.inputs]


@register_converter("EnsureShape")
def _ensure_shape(x: ConversionInput):
    shape = tf.TensorShape(x.attr("shape"))
    full = tf.TensorShape([None]).concatenate(shape) if shape.rank is not None else shape
    return stacked(tf.ensure_shape(x.input(0).t, full))


@register_converter("PlaceholderWithDefault")
def _placeholder_with_default(x: ConversionInput):
    return stacked(tf.identity(x.input(0).t))

# }}}

# {{{ matrix structure


@register_converter("MatrixBandPart")
def _band_part(x: ConversionInput):
    if not x.require_invariant(1, 2):
        return None
    return reemit_stacked(x, [w.t for w in x.inputs])


@register_converter("MatrixDiagV2", "MatrixDiagV3", "MatrixDiagPartV2", "MatrixDiagPartV3")
def _matrix_diag_v2(x: ConversionInput):
    if not x.require_invariant(*range(1, len(x.inputs))):
        return None
    return reemit_stacked(x, [w.t for w in x.inputs])


@register_converter("MatrixSetDiag", "MatrixSetDiagV2", "MatrixSetDiagV3")
def _matrix_set_diag(x: ConversionInput):
    if not x.require_invariant(*range(2, len(x.inputs))):
        return None
    values = [x.stacked_input(0), x.stacked_input(1)]
    if len(x.inputs) > 2 and x.input(2).t.shape.rank != 0 and any(
            v.shape.rank is None or v.shape[0] is None for v in values):
        return None  # TF's shape function rejects a band of diagonals with an unknown batch
    return reemit_stacked(x, values + [w.t for w in x.inputs[2:]])


@register_converter("Diag")
def _diag(x: ConversionInput):
    """``Diag`` of a rank-k value is rank 2k: flatten each iteration's value to a vector, one
    ``matrix_diag``, and reshape to ``[n, *s, *s]``."""
    t = x.input(0).t                                            # [n, *s]
    shape = tf.shape(t)
    flat = tf.reshape(t, tf.stack([shape[0], -1]))
    out = tf.reshape(tf.linalg.diag(flat), tf.concat([shape, shape[1:]], 0))
    return stacked(out)


@register_converter("DiagPart")
def _diag_part(x: ConversionInput):
    """The inverse: ``[n, *s, *s] -> [n, m, m]`` (m = prod(s)), ``matrix_diag_part``."""
    t = x.input(0).t
    rank = per_iteration_rank(x.input(0))
    if rank is None:
        return x.decline("DiagPart of a value of unknown rank")
    shape = tf.shape(t)
    half = shape[1:1 + rank // 2]
    m = tf.reduce_prod(half)
    square = tf.reshape(t, tf.stack([shape[0], m, m]))
    return stacked(tf.reshape(tf.linalg.diag_part(square), tf.concat([shape[:1], half], 0)))


@register_converter("InvertPermutation")
def _invert_permutation(x: ConversionInput):
    p = x.input(0).t
    return stacked(tf.cast(tf.argsort(p, axis=-1, stable=True), p.dtype))

# }}}

# {{{ data-dependent shapes: equal per-iteration counts are fine, ragged ones are an error


@register_converter("Where")
def _where(x: ConversionInput):
    cond = x.input(0).t
    rank = per_iteration_rank(x.input(0))
    if rank is None:
        return None
    as_bool = cond if cond.dtype == tf.bool else tf.not_equal(cond, tf.zeros([], cond.dtype))
    counts = tf.reduce_sum(tf.cast(tf.reshape(as_bool, [tf.shape(as_bool)[0], -1]), tf.int32), 1)
    count = assert_same_across(x, counts, "the number of true elements differs across "
                                           "iterations")
    coords = tf.where(as_bool)[:, 1:]                       # row-major: grouped by iteration
    return stacked(tf.reshape(coords, tf.stack([-1, count, rank])))


@register_converter("Unique")
def _unique(x: ConversionInput):
    """Per-row unique values in order of first occurrence (via a pairwise comparison)."""
    v = x.input(0).t                                          # [n, m]
    out_idx = x.attr("out_idx")
    eq = tf.equal(v[:, :, None], v[:, None, :])               # [n, m, m]
    m = tf.shape(v)[1]
    earlier = tf.linalg.band_part(tf.ones([m, m], tf.bool), -1, 0) & ~tf.eye(m, dtype=tf.bool)
    is_first = ~tf.reduce_any(eq & earlier[None], axis=2)    # [n, m]
    counts = tf.reduce_sum(tf.cast(is_first, tf.int32), 1)
    count = assert_same_across(x, counts, "the number of unique values differs across "
                                           "iterations")
    y = tf.reshape(tf.boolean_mask(v, is_first), tf.stack([-1, count]))
    slot = tf.cumsum(tf.cast(is_first, tf.int32), axis=1) - 1   # position among the uniques
    first_equal = tf.argmax(tf.cast(eq, tf.int32), axis=2, output_type=tf.int32)
    idx = tf.gather(slot, first_equal, batch_dims=1)
    return [WrappedTensor(y, True), WrappedTensor(tf.cast(idx, out_idx), True)]


@register_converter("Assert")
def _assert(x: ConversionInput):
    cond = tf.reduce_all(x.input(0).t)
    data = [w.t for w in x.inputs[1:]]
    create_op_like(x.op, [cond] + data)
    return []

# }}}

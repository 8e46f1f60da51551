"""Converters for TensorLists (what ``tf.TensorArray``, ``tf.map_fn``, ``tf.scan`` and the
accumulators of while-loop gradients are made of).

Layout: a loop-variant list is ONE list whose elements carry the batch axis (element ``k`` of
the vectorized list is ``[n, *element_shape]``, row ``i`` being element ``k`` of iteration
``i``'s list), so pushing, popping and indexing with a loop-invariant index stay single ops.
A loop-invariant list is the original list.  An invariant list that must become stacked (an
iteration-dependent write) is tiled element-wise by :func:`tile_list`.

A loop-variant *index* is served by stacking the list to a ``[length, n, ...]`` tensor and
gathering per iteration; writes at a loop-variant index are declined (per-iteration fallback).

Lists whose rows hold different numbers of elements (:class:`RowCountedList`: the lists a
``while`` loop with a loop-variant trip count pushes to, e.g. the accumulators of a
per-example-length RNN's gradient) keep the same buffer -- one list of ``[N, ...]`` elements --
plus per-row ``starts``/``ends`` (``[N]`` int32: row ``r``'s list is row ``r`` of buffer
elements ``starts[r] .. ends[r]-1``; positions past ``ends[r]`` hold junk) and ``rows``, the
buffer rows the current (possibly compacted) iterations own.  While the owned rows' ends
agree, PushBack/PopBack/GetItem/SetItem stay single list ops (plus a row scatter/gather); when
they disagree (e.g. the first pop of a gradient loop, whose examples ran for different
lengths) the buffer is realigned once so that every row ends at the same position, after
which each example pops its own last element in lockstep.  A result that would be ragged
(TensorListStack of rows with different counts) is a run-time VectorizationError.

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

from tfx_vec.pfor.converters._helpers import conversion_state, positions_of
from tfx_vec.pfor.errors import runtime_message
from tfx_vec.pfor.registry import (ConversionInput, WrappedTensor, register_converter,
                                   tile_to_stacked)

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []


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


def _stacked_element_shape(shape: tf.Tensor, n: tf.Tensor):
    """Element shape for the stacked list: ``[n, *shape]``, or None (unknown) when partial
    (not a -1 tensor: captured into a ``tf.cond`` branch it would lose its static value)."""
    dims = _static_shape(shape)
    if dims is None or any(d is None for d in dims):
        return None
    return tf.concat([tf.reshape(tf.cast(n, tf.int32), [1]), tf.constant(dims, tf.int32)], 0)


def _static_element_shape(shape: tf.Tensor):
    """A per-iteration element shape as a list (None dims unknown), or None: no tensor, which
    captured into a ``tf.cond`` branch would lose its static value."""
    return _static_shape(shape)


def list_element_shape(handle: tf.Tensor) -> tf.TensorShape | None:
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
        static = list_element_shape(handle)
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


def list_converter(*op_types: str, counted: bool = False):
    """``register_converter`` for list ops, declining vectors of per-iteration lists.

    Elements read from a list often have no static shape (the list's element shape is
    unknown); the original op's output shape is restored on the stacked result, so that the
    ops consuming it (e.g. broadcasting ones) still know their ranks.  ``counted``: the
    converter handles :class:`RowCountedList` inputs (otherwise they are an error naming the
    op: running it per iteration could not tell each row's elements).
    """
    def decorate(fn):
        def converter(x: ConversionInput):
            if _per_iteration_lists(x):
                return None
            if not counted and any(isinstance(w, RowCountedList) for w in x.inputs):
                raise x.error("this TensorList op does not handle lists whose iterations hold "
                              "different numbers of elements (pushed in a while loop whose "
                              "trip count depends on the loop index)")
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


# {{{ lists with per-row element counts

class RowCountedList(WrappedTensor):
    """A stacked list whose rows may hold different numbers of elements.

    ``t`` is one TensorList whose elements are ``[N, *element_shape]``; row ``r``'s list is
    row ``r`` of elements ``starts[r] .. ends[r] - 1`` (``starts``/``ends``: ``[N]`` int32).
    ``rows`` (``[m]`` int32, or None for ``range(N)``) are the buffer rows owned by the ``m``
    iterations currently converted: the active iterations of a ``while`` loop with a
    loop-variant trip count, which runs its body on those rows only while the list keeps all
    ``N`` rows.  Ops touch only the owned rows; the values they produce have ``m`` rows.

    ``shared``: only loop-invariant values were pushed (e.g. a weight read that a gradient
    accumulates every step), so the elements are per-iteration values (not ``[N, ...]``),
    shared by all rows, and row ``r``'s list is elements ``0 .. ends[r] - 1``: the rows of a
    loop push in lockstep, only their counts differ.  Nothing is tiled.

    What is known statically about the owned rows (so that no run-time test is emitted):
    ``aligned``: their ends are equal (true after any push or pop: the rows of one loop step
    push and pop together); ``at_end``: they all end at the buffer's end (true after a push).
    ``constant`` (shared lists): every element is the same value -- a ``while`` loop pushed
    one step-invariant value (e.g. a weight read the gradient accumulates at every step), so
    a pop is that loop-invariant value, whatever the row's count.

    Example:
        >>> import tensorflow as tf
        >>> from tensorflow.python.ops import list_ops
        >>> buf = list_ops.tensor_list_from_tensor(tf.zeros([3, 2]), tf.constant(-1))
        >>> w = RowCountedList(buf, tf.constant([0, 0]), tf.constant([3, 1]))
        >>> (w.is_stacked, w.ends.numpy().tolist())
        (True, [3, 1])
    """

    def __new__(cls, t: tf.Tensor, starts: tf.Tensor, ends: tf.Tensor,
                rows: tf.Tensor | None = None, shared: bool = False, aligned: bool = False,
                at_end: bool = False, constant: bool = False):
        self = super().__new__(cls, t, True)
        self.starts, self.ends, self.rows, self.shared = starts, ends, rows, shared
        self.aligned, self.at_end = aligned or at_end, at_end
        self.constant = shared and constant
        return self

    def _replace(self, **kw):  # keep the counts when a handle is re-emitted (Identity)
        return self.like(kw.get("t", self.t), self.starts, self.ends, aligned=self.aligned,
                         at_end=self.at_end, constant=self.constant)

    def like(self, t: tf.Tensor, starts: tf.Tensor, ends: tf.Tensor, *, aligned: bool = False,
             at_end: bool = False, constant: bool = False) -> "RowCountedList":
        """Same owned rows and layout kind, new buffer and counts."""
        return RowCountedList(t, starts, ends, self.rows, self.shared, aligned, at_end,
                              constant)

    @property
    def layout(self) -> tuple[int, bool, bool, bool]:
        """``(count_kind, aligned, at_end, constant)``."""
        return count_kind(self), self.aligned, self.at_end, self.constant


#: :func:`count_kind` values: a list without per-row counts, a shared one, a per-row one.
UNCOUNTED, SHARED, PER_ROW = 0, 1, 2


def count_kind(w: WrappedTensor) -> int:
    if not isinstance(w, RowCountedList):
        return UNCOUNTED
    return SHARED if w.shared else PER_ROW


def layout_of(w: WrappedTensor) -> tuple[int, bool, bool, bool]:
    """``RowCountedList.layout`` of any value (``(0, False, False, False)`` if uncounted)."""
    return w.layout if isinstance(w, RowCountedList) else (UNCOUNTED, False, False, False)


def aligned_entry(w: RowCountedList, dtype: tf.DType,
                  element_shape: tf.TensorShape | None = None) -> RowCountedList:
    """``w`` with its rows' ends aligned at the buffer's end (a loop over a list whose rows
    hold different counts -- a gradient loop over its forward loop's accumulators -- then
    pops and pushes with no run-time layout test; the realignment is what its first pop
    would do; ``element_shape``: per iteration, needed when some elements are unset)."""
    if w.shared or w.at_end:
        return w
    shape = None
    if element_shape is not None and element_shape.is_fully_defined():
        shape = tf.concat([tf.reshape(_n_rows(w), [1]),
                           tf.constant(element_shape.as_list(), tf.int32)], 0)
    empty = tf.equal(list_ops.tensor_list_length(w.t), 0)   # then every row is empty
    buf, starts, ends = tf.cond(
        empty, lambda: (w.t, tf.zeros_like(w.starts), tf.zeros_like(w.ends)),
        lambda: _realign(w, dtype, shape))
    return w.like(buf, starts, ends, aligned=True, at_end=True)


def counted_parts(w: WrappedTensor, n: tf.Tensor, original: tf.Tensor | None = None,
                  kind: int = PER_ROW):
    """``(buffer, starts, ends, rows)`` of a list value in the layout ``kind``: a uniform (or
    invariant) list has every row at ``[0, length)``; a shared list becomes per-row by
    tiling its elements (``kind=SHARED`` needs an invariant or shared list)."""
    if isinstance(w, RowCountedList):
        if kind == PER_ROW and w.shared:
            w = _unshare(w, handle_dtype(original) if original is not None else None)
        return w.t, w.starts, w.ends, w.rows
    t = w.t if kind == SHARED else stack_like(w, n, original)
    n = tf.cast(n, tf.int32)
    return t, tf.zeros([n], tf.int32), tf.fill([n], list_ops.tensor_list_length(t)), None


def _unshare(w: RowCountedList, dtype: tf.DType | None, item_shape=None) -> RowCountedList:
    """A shared list in the per-row layout: every element tiled to ``[N, ...]``
    (``item_shape``: the per-iteration element shape, needed when the list is empty)."""
    if dtype is None:
        dtype = handle_dtype(w.t)
    n_rows = _n_rows(w)
    dense = list_ops.tensor_list_stack(w.t, dtype, element_shape=item_shape)   # [B, *S]
    rep = tf.concat([[1], tf.reshape(n_rows, [1]), tf.ones([tf.rank(dense) - 1], tf.int32)], 0)
    tiled = tf.tile(tf.expand_dims(dense, 1), rep)
    return RowCountedList(list_ops.tensor_list_from_tensor(tiled, tf.constant(-1, tf.int32)),
                          w.starts, w.ends, w.rows, shared=False, aligned=w.aligned,
                          at_end=w.at_end)


def _owned(v: tf.Tensor, rows: tf.Tensor | None) -> tf.Tensor:
    """The owned rows of a per-buffer-row value."""
    return v if rows is None else tf.gather(v, rows)


def _to_buffer_rows(x: ConversionInput, values: tf.Tensor, rows: tf.Tensor | None,
                    n_rows: tf.Tensor) -> tf.Tensor:
    """``[m, ...]`` values of the owned rows -> ``[N, ...]`` (zeros elsewhere: junk rows)."""
    if rows is None:
        return values
    # A gather from the values plus one zero row (CPU ScatterNd is several times slower);
    # the gather indices are made once per graph and owned rows (one per loop step), in a
    # cache that lives as long as the conversion.
    graph = tf.compat.v1.get_default_graph()
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    key = (rows.ref(), n_rows.ref() if isinstance(n_rows, tf.Tensor) else n_rows, id(context))
    cache = conversion_state(x, "row_sources", dict)
    source = cache.get(key)
    if source is None or source.graph is not graph:
        m = tf.size(rows)
        source = cache[key] = tf.tensor_scatter_nd_update(
            tf.fill(tf.reshape(n_rows, [1]), m), tf.expand_dims(rows, 1), positions_of(rows))
    return tf.gather(tf.concat([values, tf.zeros_like(values[:1])], 0), source)


def _add_owned(v: tf.Tensor, rows: tf.Tensor | None, delta: tf.Tensor) -> tf.Tensor:
    if rows is None:
        return v + delta
    return tf.tensor_scatter_nd_add(v, tf.expand_dims(rows, 1),
                                    tf.broadcast_to(delta, tf.shape(rows)))


def _set_owned(v: tf.Tensor, rows: tf.Tensor | None, values: tf.Tensor) -> tf.Tensor:
    if rows is None:
        return values
    return tf.tensor_scatter_nd_update(v, tf.expand_dims(rows, 1), values)


def _agree(v: tf.Tensor):
    """(all entries of ``v`` equal, their value; 0 for an empty ``v``)."""
    hi = tf.reduce_max(tf.concat([v, [tf.int32.min]], 0))
    lo = tf.reduce_min(tf.concat([v, [tf.int32.max]], 0))
    return (hi <= lo) | (tf.size(v) == 0), tf.maximum(hi, 0)


def _n_rows(w: RowCountedList) -> tf.Tensor:
    return tf.size(w.starts)


def _dense(handle: tf.Tensor, dtype: tf.DType, shape) -> tf.Tensor:
    """The buffer as ``[N, B, *S]`` (``shape``: the ``[N, *S]`` element shape, or -1)."""
    return transpose01(list_ops.tensor_list_stack(handle, dtype, element_shape=shape))


def _from_dense(dense: tf.Tensor) -> tf.Tensor:
    return list_ops.tensor_list_from_tensor(transpose01(dense), tf.constant(-1, tf.int32))


def _realign(w: RowCountedList, dtype: tf.DType, shape):
    """Move every row's elements to end at one position ``top`` = the longest row (the
    buffer's new length; empty rows too), so that rows whose ends disagreed push and pop in
    lockstep afterwards."""
    lens = w.ends - w.starts
    top = tf.reduce_max(tf.concat([lens, [0]], 0))
    dense = list_ops.tensor_list_stack(w.t, dtype, element_shape=shape)   # [B, N, *S]
    last = tf.maximum(tf.shape(dense)[0] - 1, 0)
    new_starts = top - lens
    src = w.starts[None, :] + tf.range(top)[:, None] - new_starts[None, :]     # [top, N]
    row = tf.broadcast_to(tf.range(tf.size(lens))[None, :], tf.shape(src))
    # gather_nd keeps the [position, row] layout: no transposes of the whole buffer.
    moved = tf.gather_nd(dense, tf.stack([tf.clip_by_value(src, 0, last), row], -1))
    return (list_ops.tensor_list_from_tensor(moved, tf.constant(-1, tf.int32)), new_starts,
            new_starts + lens)


def _element_shape_of(item: tf.Tensor, rows, n_rows) -> tf.Tensor:
    """``[N, *S]`` from an owned-rows item ``[m, *S]``."""
    return tf.concat([tf.reshape(n_rows, [1]), tf.shape(item)[1:]], 0)


def _check(x: ConversionInput, ok: tf.Tensor, message: str, *data) -> list:
    """A run-time assertion naming the op (raised as VectorizationError by the eager API)."""
    return [tf.debugging.Assert(ok, [runtime_message(x.op, message)] + list(data),
                                summarize=20)]


def _counted_push(x: ConversionInput, w: RowCountedList, item: tf.Tensor) -> RowCountedList:
    dtype, rows, n_rows = _dtype(x), w.rows, _n_rows(w)
    full = _to_buffer_rows(x, item, rows, n_rows)
    shape = _element_shape_of(item, rows, n_rows)
    if w.at_end:
        buf, starts, ends = w.t, w.starts, w.ends
    else:
        length = list_ops.tensor_list_length(w.t)
        in_step = tf.reduce_all(tf.equal(_owned(w.ends, rows), length))
        buf, starts, ends = tf.cond(in_step, lambda: (w.t, w.starts, w.ends),
                                    lambda: _realign(w, dtype, shape))
    return w.like(list_ops.tensor_list_push_back(buf, full), starts, _add_owned(ends, rows, 1),
                  at_end=True)


def _counted_pop(x: ConversionInput, w: RowCountedList, shape: tf.Tensor):
    dtype, rows = _dtype(x), w.rows
    lens = _owned(w.ends - w.starts, rows)
    checks = _check(x, tf.reduce_all(lens > 0), "pop from an empty list in some iteration; "
                    "per-iteration element counts:", lens)
    agree, end = _agree(_owned(w.ends, rows))

    def realigned():
        buf, starts, ends = _realign(w, dtype, shape)
        return buf, starts, ends, tf.reduce_max(tf.concat([ends, [0]], 0))

    with tf.control_dependencies(checks):
        if w.aligned:
            buf, starts, ends, end = w.t, w.starts, w.ends, tf.identity(end)
        else:
            buf, starts, ends, end = tf.cond(agree, lambda: (w.t, w.starts, w.ends, end),
                                             realigned)
    item = _owned(list_ops.tensor_list_get_item(buf, tf.maximum(end - 1, 0), dtype,
                                                element_shape=shape), rows)
    ends = _add_owned(ends, rows, -1)
    # Drop the trailing positions no row holds any more, so a push after pops is in step.
    held = tf.where(ends > starts, ends, 0)
    buf = list_ops.tensor_list_resize(buf, tf.reduce_max(tf.concat([held, [0]], 0)))
    return w.like(buf, starts, ends, aligned=True), item


def _read_positions(x: ConversionInput, w: RowCountedList, index: tf.Tensor, shape) -> tf.Tensor:
    """Row ``k`` of the owned rows reads its element ``index[k]`` (``index``: ``[m]`` or a
    scalar), checked against each row's count."""
    dtype, rows = _dtype(x), w.rows
    starts, lens = _owned(w.starts, rows), _owned(w.ends - w.starts, rows)
    index = tf.broadcast_to(tf.cast(index, tf.int32), tf.shape(starts))
    checks = _check(x, tf.reduce_all((index >= 0) & (index < lens)), "index out of range in "
                    "some iteration; per-iteration indices and element counts:", index, lens)
    pos = starts + index
    agree, p = _agree(pos)

    def in_step():
        return _owned(list_ops.tensor_list_get_item(w.t, p, dtype, element_shape=shape), rows)

    def per_row():
        dense = _owned(_dense(w.t, dtype, shape), rows)
        last = tf.maximum(tf.shape(dense)[1] - 1, 0)
        return tf.gather(dense, tf.clip_by_value(pos, 0, last), batch_dims=1)

    with tf.control_dependencies(checks):
        return tf.cond(agree, in_step, per_row)


def _counted_set(x: ConversionInput, w: RowCountedList, index: tf.Tensor, item: tf.Tensor,
                 resize: bool) -> RowCountedList:
    dtype, rows, n_rows = _dtype(x), w.rows, _n_rows(w)
    starts, ends = _owned(w.starts, rows), _owned(w.ends, rows)
    index = tf.broadcast_to(tf.cast(index, tf.int32), tf.shape(starts))
    pos = starts + index
    ok = index >= 0
    if not resize:
        ok = ok & (pos < ends)
    checks = _check(x, tf.reduce_all(ok),
                    "index out of range in some iteration; per-iteration indices and element "
                    "counts:", index, ends - starts)
    with tf.control_dependencies(checks):
        pos = tf.identity(pos)
    new_ends = tf.maximum(ends, pos + 1) if resize else ends
    need = tf.reduce_max(tf.concat([new_ends, [0]], 0))
    buf = w.t
    if resize:
        length = list_ops.tensor_list_length(buf)
        buf = tf.cond(need > length, lambda: list_ops.tensor_list_resize(buf, need),
                      lambda: buf)
    agree, p = _agree(pos)
    in_step = agree & tf.reduce_all(pos <= ends)   # no row leaves a gap of unset elements
    shape = _element_shape_of(item, rows, n_rows)

    def one_element():
        old = list_ops.tensor_list_get_item(buf, p, dtype, element_shape=shape)
        new = item if rows is None else tf.tensor_scatter_nd_update(
            old, tf.expand_dims(rows, 1), item)
        return list_ops.tensor_list_set_item(buf, p, new)

    def per_row():
        dense = _dense(buf, dtype, shape)                           # [N, B, *S]
        grid = tf.range(tf.shape(dense)[1])[None, :]
        full_pos = _set_owned(tf.fill([n_rows], -1), rows, pos)
        write = tf.equal(grid, full_pos[:, None])
        gap = (grid >= w.ends[:, None]) & (grid < full_pos[:, None])  # unset: zeros
        extra = tf.ones([tf.rank(dense) - 2], tf.int32)
        as_mask = lambda m: tf.reshape(m, tf.concat([tf.shape(m), extra], 0))
        value = tf.expand_dims(_to_buffer_rows(x, item, rows, n_rows), 1)
        dense = tf.where(as_mask(write), value, tf.where(as_mask(gap), tf.zeros_like(dense),
                                                         dense))
        return _from_dense(dense)

    out = tf.cond(in_step, one_element, per_row)
    return w.like(out, w.starts, _set_owned(w.ends, rows, new_ends))


def _every_index(x: ConversionInput, lens: tf.Tensor) -> tf.Tensor:
    """``range(K)``, the indices of every element of each owned row, after a run-time check
    that every row holds the same ``K`` (``lens``: the owned rows' element counts)."""
    same, k = _agree(lens)
    checks = _check(x, same, "per-iteration lists have different lengths, so their stacked "
                    "results differ across iterations (a ragged result cannot be stacked); "
                    "per-iteration lengths:", lens)
    with tf.control_dependencies(checks):
        return tf.range(k)


def _counted_stack(x: ConversionInput, w: RowCountedList, shape, indices=None) -> tf.Tensor:
    """``[m, K, *S]``: each owned row's elements (``indices``: ``[K]`` or ``[m, K]``, else
    all of them, which must be equally many in every row)."""
    dtype, rows = _dtype(x), w.rows
    starts, lens = _owned(w.starts, rows), _owned(w.ends - w.starts, rows)
    if indices is None:
        indices = _every_index(x, lens)
        pos = starts[:, None] + indices[None, :]
    else:
        indices = tf.cast(indices, tf.int32)
        wide = indices if indices.shape.rank == 2 else indices[None, :]
        checks = _check(x, tf.reduce_all((wide >= 0) & (wide < lens[:, None])),
                        "index out of range in some iteration; per-iteration element counts:",
                        lens)
        with tf.control_dependencies(checks):
            pos = starts[:, None] + wide
    agree, s = _agree(starts)

    def in_step():  # the same positions in every row: one gather of whole elements
        got = list_ops.tensor_list_gather(w.t, s + indices, dtype, element_shape=shape)
        return _owned(transpose01(got), rows)

    def per_row():
        dense = _owned(_dense(w.t, dtype, shape), rows)
        last = tf.maximum(tf.shape(dense)[1] - 1, 0)
        pos_ = tf.broadcast_to(pos, [tf.size(starts), tf.shape(pos)[1]])
        return tf.gather(dense, tf.clip_by_value(pos_, 0, last), batch_dims=1)

    if indices.shape.rank == 2:
        return per_row()
    return tf.cond(agree, in_step, per_row)


def _shared_push(x: ConversionInput, w: RowCountedList, item: tf.Tensor) -> RowCountedList:
    """An invariant item pushed by rows that all end at the buffer's end."""
    owned = _owned(w.ends, w.rows)
    checks = _check(x, tf.reduce_all(tf.equal(owned, list_ops.tensor_list_length(w.t))),
                    "iterations push a loop-invariant value onto a list after popping "
                    "different numbers of elements; per-iteration element counts:", owned)
    with tf.control_dependencies(checks):
        buf = list_ops.tensor_list_push_back(w.t, item)
    return w.like(buf, w.starts, _add_owned(w.ends, w.rows, 1))


def _shared_read(x: ConversionInput, w: RowCountedList, index: tf.Tensor,
                 shape) -> WrappedTensor:
    """Row ``k`` of the owned rows reads its element ``index[k]`` of a shared list (of a
    constant one: the one loop-invariant value)."""
    lens = _owned(w.ends - w.starts, w.rows)
    index = tf.broadcast_to(tf.cast(index, tf.int32), tf.shape(lens))
    checks = _check(x, tf.reduce_all((index >= 0) & (index < lens)), "index out of range in "
                    "some iteration; per-iteration indices and element counts:", index, lens)
    with tf.control_dependencies(checks):
        if w.constant:
            return _out(list_ops.tensor_list_get_item(w.t, 0, _dtype(x), element_shape=shape),
                        False)
        return _out(list_ops.tensor_list_gather(w.t, index, _dtype(x), element_shape=shape))


def _shared_pop(x: ConversionInput, w: RowCountedList, shape):
    lens = _owned(w.ends - w.starts, w.rows)
    checks = _check(x, tf.reduce_all(lens > 0), "pop from an empty list in some iteration; "
                    "per-iteration element counts:", lens)
    with tf.control_dependencies(checks):
        item = _shared_read(x, w, lens - 1, shape)
    return (w.like(w.t, w.starts, _add_owned(w.ends, w.rows, -1), constant=w.constant), item)


def _shared_elements(x: ConversionInput, w: RowCountedList, indices: tf.Tensor | None, shape):
    """TensorListStack (``indices`` None) / TensorListGather of a shared list: loop-invariant
    when every row reads the same elements."""
    lens = _owned(w.ends - w.starts, w.rows)
    if indices is None:
        indices = _every_index(x, lens)
    indices = tf.cast(indices, tf.int32)
    wide = indices if indices.shape.rank == 2 else indices[None, :]
    checks = _check(x, tf.reduce_all((wide >= 0) & (wide < lens[:, None])),
                    "index out of range in some iteration; per-iteration element counts:", lens)
    with tf.control_dependencies(checks):
        if indices.shape.rank == 2:   # per-iteration indices: [m, k, *S]
            dense = list_ops.tensor_list_stack(w.t, _dtype(x), element_shape=shape)
            return _out(tf.gather(dense, indices))
        return _out(list_ops.tensor_list_gather(w.t, indices, _dtype(x), element_shape=shape),
                    False)


def slice_counted(w: RowCountedList, j: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Iteration ``j``'s own list (for ops run once per iteration)."""
    r = j if w.rows is None else tf.gather(w.rows, j)
    dense = list_ops.tensor_list_stack(w.t, dtype)
    if not w.shared:
        dense = tf.gather(dense, r, axis=1)   # [B, *S]
    own = dense[tf.gather(w.starts, r):tf.gather(w.ends, r)]
    return list_ops.tensor_list_from_tensor(own, tf.constant(-1, tf.int32))

# }}}


@list_converter("TensorListFromTensor")
def _from_tensor(x: ConversionInput):
    t = x.stacked_input(0)  # [n, L, *S]
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    return [_out(list_ops.tensor_list_from_tensor(transpose01(t), shape))]


@list_converter("TensorListStack", counted=True)
def _stack(x: ConversionInput):
    w = x.inputs[0]
    if isinstance(w, RowCountedList) and w.shared:
        return [_shared_elements(x, w, None, _static_element_shape(x.unstacked_input(1)))]
    if isinstance(w, RowCountedList):
        shape = _stacked_element_shape(x.unstacked_input(1), _n_rows(w))
        return [_out(_counted_stack(x, w, shape))]
    handle = _stacked_list(x)
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    dense = list_ops.tensor_list_stack(handle, _dtype(x), element_shape=shape,
                                       num_elements=x.attr("num_elements"))
    return [_out(transpose01(dense))]


@list_converter("TensorListLength", counted=True)
def _length(x: ConversionInput):
    w = x.inputs[0]
    if isinstance(w, RowCountedList):
        return [_out(_owned(w.ends - w.starts, w.rows))]
    return [_out(list_ops.tensor_list_length(x.inputs[0].t), False)]


@list_converter("TensorListElementShape", counted=True)
def _element_shape(x: ConversionInput):
    static = list_element_shape(x.op.inputs[0])  # the list's own, when known (a stacked
    if static is not None:                       # list built anew may have forgotten it)
        return [_out(tf.constant(static.as_list(), x.attr("shape_type")), False)]
    if isinstance(x.inputs[0], RowCountedList) and x.inputs[0].shared:  # per-iteration elements
        return [_out(list_ops.tensor_list_element_shape(x.inputs[0].t, x.attr("shape_type")),
                     False)]
    shape = list_ops.tensor_list_element_shape(x.inputs[0].t, x.attr("shape_type"))
    return [_out(tf.cond(tf.rank(shape) > 0, lambda: shape[1:], lambda: shape), False)]


@list_converter("TensorListGetItem", counted=True)
def _get_item(x: ConversionInput):
    handle, index = x.inputs[0], x.inputs[1]
    dtype = _dtype(x)
    if isinstance(handle, RowCountedList) and handle.shared:
        shape = _static_element_shape(x.unstacked_input(2))
        return [_shared_read(x, handle, index.t, shape)]
    if isinstance(handle, RowCountedList):
        shape = _stacked_element_shape(x.unstacked_input(2), _n_rows(handle))
        return [_out(_read_positions(x, handle, index.t, shape))]
    if handle.is_stacked and not index.is_stacked:
        shape = _stacked_element_shape(x.unstacked_input(2), x.loop_len)
        return [_out(list_ops.tensor_list_get_item(handle.t, index.t, dtype, shape))]
    if not handle.is_stacked:  # invariant list, per-iteration index: one gather
        return [_out(list_ops.tensor_list_gather(handle.t, index.t, dtype,
                                                 element_shape=x.unstacked_input(2)))]
    dense = transpose01(list_ops.tensor_list_stack(handle.t, dtype))  # [n, L, *S]
    return [_out(tf.gather(dense, index.t, batch_dims=1))]


@list_converter("TensorListGather", counted=True)
def _gather(x: ConversionInput):
    handle, indices = x.inputs[0], x.inputs[1]
    dtype = _dtype(x)
    if isinstance(handle, RowCountedList) and handle.shared:
        return [_shared_elements(x, handle, indices.t,
                                 _static_element_shape(x.unstacked_input(2)))]
    if isinstance(handle, RowCountedList):
        shape = _stacked_element_shape(x.unstacked_input(2), _n_rows(handle))
        return [_out(_counted_stack(x, handle, shape, indices.t))]
    if not handle.is_stacked:
        dense = list_ops.tensor_list_stack(handle.t, dtype, element_shape=x.unstacked_input(2))
        return [_out(tf.gather(dense, indices.t))]
    dense = transpose01(list_ops.tensor_list_stack(handle.t, dtype))  # [n, L, *S]
    if indices.is_stacked:
        return [_out(tf.gather(dense, indices.t, batch_dims=1))]
    return [_out(tf.gather(dense, indices.t, axis=1))]


@list_converter("TensorListSetItem", counted=True)
def _set_item(x: ConversionInput):
    attrs = x.op.node_def.attr
    resize = "resize_if_index_out_of_bounds" in attrs and attrs["resize_if_index_out_of_bounds"].b
    w = x.inputs[0]
    if isinstance(w, RowCountedList):
        item = _item(x, 2)
        if w.shared:
            w = _unshare(w, _dtype(x), tf.shape(item)[1:])
        return [_counted_set(x, w, x.inputs[1].t, item, resize)]
    if x.is_stacked(1):
        return None  # writes at iteration-dependent positions: per-iteration fallback
    handle = _stacked_list(x, 0, item=2)
    kw = {"resize_if_index_out_of_bounds": True} if resize else {}
    out = gen_list_ops.tensor_list_set_item(handle, x.inputs[1].t, _item(x, 2), **kw)
    return [_out(out)]


@list_converter("TensorListPushBack", counted=True)
def _push_back(x: ConversionInput):
    w = x.inputs[0]
    if isinstance(w, RowCountedList) and w.shared and not x.is_stacked(1):
        return [_shared_push(x, w, x.inputs[1].t)]
    if isinstance(w, RowCountedList):
        item = _item(x, 1)
        if w.shared:
            w = _unshare(w, _dtype(x), tf.shape(item)[1:])
        return [_counted_push(x, w, item)]
    handle = _stacked_list(x, 0, item=1)
    return [_out(list_ops.tensor_list_push_back(handle, _item(x, 1)))]


@list_converter("TensorListPopBack", counted=True)
def _pop_back(x: ConversionInput):
    w = x.inputs[0]
    if isinstance(w, RowCountedList) and w.shared:
        out, item = _shared_pop(x, w, _static_element_shape(x.unstacked_input(1)))
        return [out, item]
    if isinstance(w, RowCountedList):
        shape = _stacked_element_shape(x.unstacked_input(1), _n_rows(w))
        out, item = _counted_pop(x, w, shape)
        return [out, _out(item)]
    shape = _stacked_element_shape(x.unstacked_input(1), x.loop_len)
    handle, item = gen_list_ops.tensor_list_pop_back(
        x.inputs[0].t, tf.constant(-1, tf.int32) if shape is None else shape, _dtype(x))
    return [_out(handle), _out(item)]


@list_converter("TensorListScatterIntoExistingList")
def _scatter_existing(x: ConversionInput):
    handle = _stacked_list(x)
    tensor = transpose01(x.stacked_input(1))  # [k, n, *S]
    if not x.is_stacked(2):
        return [_out(list_ops.tensor_list_scatter(tensor, x.inputs[2].t, input_handle=handle))]
    # Each iteration writes its own positions: scatter into the dense [L, n, *S] elements
    # at (position, iteration); duplicate positions keep the last write, as the loop does.
    indices = tf.cast(x.inputs[2].t, tf.int32)                     # [n, k]
    shape = _stacked_element_shape(_per_iteration_item_shape(x), x.loop_len)
    dense = list_ops.tensor_list_stack(handle, _dtype(x), element_shape=shape)
    rows = tf.broadcast_to(tf.range(tf.shape(indices)[0])[:, None], tf.shape(indices))
    coords = tf.reshape(tf.stack([indices, rows], -1), [-1, 2])
    updates = tf.reshape(x.stacked_input(1), tf.concat([[-1], tf.shape(dense)[2:]], 0))
    dense = tf.tensor_scatter_nd_update(dense, coords, updates)
    return [_out(list_ops.tensor_list_from_tensor(dense, tf.constant(-1, tf.int32)))]


def _per_iteration_item_shape(x: ConversionInput) -> tf.Tensor:
    """The per-iteration element shape of the scattered items (input 1: ``[k, *S]``)."""
    static = x.op.inputs[1].shape[1:]
    if static.is_fully_defined():
        return tf.constant(static.as_list(), tf.int32)
    return tf.constant(-1, tf.int32)


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
    """A loop-variant length: a :class:`RowCountedList` (``Reserve``: each row holds its own
    number of unset elements); a loop-variant capacity (``EmptyTensorList``) is no limit."""
    x.unstacked_input(0)  # the element shape must be the same in every iteration
    if x.op_type == "EmptyTensorList":
        return [_out(list_ops.tensor_list_reserve(tf.constant(-1, tf.int32), 0, _dtype(x)))]
    counts = tf.cast(x.stacked_input(1), tf.int32)
    top = tf.reduce_max(tf.concat([counts, [0]], 0))
    buf = list_ops.tensor_list_reserve(tf.constant(-1, tf.int32), top, _dtype(x))
    return [RowCountedList(buf, tf.zeros_like(counts), tf.maximum(counts, 0))]


@list_converter("TensorListResize")
def _resize(x: ConversionInput):
    if x.is_stacked(1):
        return None
    return [_out(list_ops.tensor_list_resize(_stacked_list(x), x.inputs[1].t))]


@list_converter("TensorListConcat", "TensorListConcatV2")
def _concat(x: ConversionInput):
    """Each iteration's elements ``[e, *S]`` concatenated: the stacked elements ``[n, e, *S]``
    stacked to ``[L, n, e, *S]`` and regrouped to ``[n, L*e, *S]`` (every element must have
    the same leading size ``e``, as stacking them requires); the lengths are ``[e] * L``."""
    handle = _stacked_list(x)
    static = list_element_shape(x.op.inputs[0])
    shape = (_stacked_element_shape(tf.constant(static.as_list(), tf.int32), x.loop_len)
             if static is not None else None)
    dense = transpose01(list_ops.tensor_list_stack(handle, _dtype(x), element_shape=shape))
    dims = tf.shape(dense)                                          # [n, L, e, *S]
    out = tf.reshape(dense, tf.concat([dims[:1], [dims[1] * dims[2]], dims[3:]], 0))
    lengths = tf.fill(dims[1:2], tf.cast(dims[2], tf.int64))
    return [_out(out), _out(lengths, False)]


@list_converter("TensorListSplit", "TensorListConcatLists", "TensorListPushBackBatch")
def _per_iteration_only(x: ConversionInput):
    """No vectorized form: run per iteration (lists with per-row counts: an error naming the
    op, raised by :func:`list_converter`, instead of a failure inside the fallback)."""
    return None


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

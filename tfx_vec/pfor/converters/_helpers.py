"""Family helpers and small utilities shared by every converter module.

Families (each registers one converter for many op types):

- :func:`elementwise` — unary ops that work on any shape: re-emit the op on the stacked input.
- :func:`broadcasting` — n-ary ops with NumPy broadcasting: give every stacked input the same
  rank (singleton axes after the batch axis) and re-emit; loop-invariant inputs are never tiled.
- :func:`same_shape` — n-ary ops whose inputs must have equal shapes (AddN): tile as needed.
- :func:`reduction` — ops with an ``axis`` input: shift non-negative axes past the batch axis.

Utilities: :func:`create_op_like` (re-emit an op with new inputs, copying its attrs),
:func:`shift_axis`, :func:`expand_after_batch`, :func:`fold_batch` / :func:`unfold_batch`
(``[n, a, ...] <-> [n*a, ...]``), :func:`folded_form` / :func:`map_folded` (work on the
folded value behind an unfolding reshape), :func:`static_rank`, :func:`static_value`.

Example:
    >>> import tfx_vec.pfor.converters._helpers as h
    >>> h.shift_axis(2).tolist(), h.shift_axis(-1).tolist()
    (3, -1)
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import execute
from tensorflow.python.framework import ops as tf_ops

from tfx_vec.pfor.errors import runtime_message
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter


# {{{ re-emitting ops

def copy_functions(op: tf.Operation, graph: tf.Graph | None = None) -> None:
    """Make every function named in ``op``'s attrs available in ``graph`` (default graph)."""
    graph = graph or tf_ops.get_default_graph()
    names = []
    for value in op.node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        if value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    for name in names:
        if graph._is_function(name):  # pylint: disable=protected-access
            continue
        g = op.graph
        fn = None
        while g is not None and fn is None:
            fn = g._get_function(name)  # pylint: disable=protected-access
            g = getattr(g, "outer_graph", None)
        if fn is not None:
            graph._add_function_recursive(fn)  # pylint: disable=protected-access


def create_op_like(op: tf.Operation, inputs: Sequence[tf.Tensor], *, op_type: str | None = None,
                   dtypes: Sequence[tf.DType] | None = None,
                   attrs: dict[str, Any] | None = None,
                   drop_attrs: Sequence[str] = ()) -> list[tf.Tensor]:
    """Emit an op like ``op`` (same type and attrs unless overridden) on ``inputs``.

    ``attrs`` values may be AttrValue protos or plain Python values (converted through
    ``attr_value``).  Returns the new op's outputs.
    """
    return list(emit_op(op, inputs, op_type=op_type, dtypes=dtypes, attrs=attrs,
                        drop_attrs=drop_attrs).outputs)


def emit_op(op: tf.Operation, inputs: Sequence[tf.Tensor], *, op_type: str | None = None,
            dtypes: Sequence[tf.DType] | None = None, attrs: dict[str, Any] | None = None,
            drop_attrs: Sequence[str] = ()) -> tf.Operation:
    """Like :func:`create_op_like` but returns the new ``tf.Operation``."""
    graph = tf_ops.get_default_graph()
    copy_functions(op, graph)
    new_attrs = {k: v for k, v in op.node_def.attr.items()
                 if k not in drop_attrs and not k.startswith("_")}
    for k, v in (attrs or {}).items():
        new_attrs[k] = v if hasattr(v, "SerializeToString") else attr_value(v)
    op_type = op_type or op.type
    dtypes = list(dtypes) if dtypes is not None else [o.dtype for o in op.outputs]
    inputs = [tf.convert_to_tensor(t) for t in inputs]
    new_op = graph.create_op(op_type, inputs, dtypes, attrs=new_attrs,
                             name=op.name.rsplit("/", 1)[-1], compute_device=True)
    flat = []
    for name in new_attrs:
        flat.extend([name, new_op.get_attr(name)])
    execute.record_gradient(op_type, new_op.inputs, tuple(flat), new_op.outputs[:])
    return new_op


def attr_value(v: Any):
    """A Python value as an AttrValue proto (bool, int, float, str/bytes, DType, lists)."""
    from tensorflow.core.framework import attr_value_pb2
    a = attr_value_pb2.AttrValue()
    if isinstance(v, bool):
        a.b = v
    elif isinstance(v, (int, np.integer)):
        a.i = int(v)
    elif isinstance(v, float):
        a.f = v
    elif isinstance(v, tf.DType):
        a.type = v.as_datatype_enum
    elif isinstance(v, (str, bytes)):
        a.s = v.encode() if isinstance(v, str) else v
    elif isinstance(v, (list, tuple)):
        if all(isinstance(e, tf.DType) for e in v) and v:
            a.list.type.extend(e.as_datatype_enum for e in v)
        elif all(isinstance(e, (int, np.integer)) for e in v):
            a.list.i.extend(int(e) for e in v)
        elif all(isinstance(e, float) for e in v):
            a.list.f.extend(v)
        else:
            a.list.s.extend(e.encode() if isinstance(e, str) else e for e in v)
    else:
        raise TypeError(f"cannot convert {v!r} to an AttrValue")
    return a


def conversion_state(x: ConversionInput, key: str, make: Callable[[], Any]) -> Any:
    """State a converter family keeps for the length of one conversion (stacks it created,
    gradient arrays, cached gather indices), made by ``make()`` on first use."""
    state = x.vectorizer.converter_state
    if key not in state:
        state[key] = make()
    return state[key]


#: ``conversion_state`` key: ``{placeholder ref: tensor}`` for the resource placeholders and
#: the loop length of a dry run (a loop body converted to learn which values come out
#: stacked).
DRY_RUN_SOURCES = "dry_run_sources"


def dry_run_source(x: ConversionInput, t: tf.Tensor) -> tf.Tensor:
    """The tensor a dry run's placeholder ``t`` stands for (``t`` itself outside dry
    runs)."""
    sources = x.vectorizer.converter_state.get(DRY_RUN_SOURCES, {})
    while t.ref() in sources:
        t = sources[t.ref()]
    return t


def handle_source(x: ConversionInput, handle: tf.Tensor) -> tf.Tensor:
    """The tensor a stack or TensorArray ``handle`` comes from: through dry-run placeholders
    and the ops that only forward it (``Identity``, a TF1 loop's ``Enter``)."""
    handle = dry_run_source(x, handle)
    while handle.op.type in ("Identity", "Enter"):
        handle = dry_run_source(x, handle.op.inputs[0])
    return handle


def runs_every_iteration(x: ConversionInput) -> bool:
    """Whether ``x``'s op is converted for all the iterations at once (not for those a
    loop-variant ``tf.cond`` or while condition keeps, nor masked)."""
    return (dry_run_source(x, x.loop_len) is x.vectorizer.loop_len
            and not x.vectorizer.masked_depth)


def copy_state(value: Any) -> Any:
    """A copy of a ``conversion_state`` entry that later changes to ``value`` do not touch
    (containers are copied, down through tuples; the ops and tensors they hold are not)."""
    if isinstance(value, tuple):
        return tuple(copy_state(v) for v in value)
    if isinstance(value, (dict, set, list)):
        return type(value)(value)
    return value


def stacked(*tensors: tf.Tensor) -> list[WrappedTensor]:
    """Wrap every tensor as stacked."""
    return [WrappedTensor(t, True) for t in tensors]


def reemit_stacked(x: ConversionInput, inputs: Sequence[tf.Tensor], **kw) -> list[WrappedTensor]:
    """Re-emit ``x.op`` on ``inputs``; every output is stacked."""
    return stacked(*create_op_like(x.op, inputs, **kw))

# }}}


# {{{ shapes and axes

def static_rank(t: tf.Tensor) -> int | None:
    return t.shape.rank


def same_static_shape(a: tf.Tensor, b: tf.Tensor) -> bool:
    """True when both shapes are fully known and equal (an op that keeps the shape)."""
    return a.shape.is_fully_defined() and a.shape == b.shape


def static_value(t: tf.Tensor) -> np.ndarray | None:
    """The constant value of ``t`` if TF can compute it at graph-construction time."""
    try:
        return tf.get_static_value(t)
    except (TypeError, ValueError):
        return None


def shape_list(t: tf.Tensor) -> list:
    """Static dims where known, scalar tensors elsewhere (rank must be known)."""
    static = t.shape.as_list()
    dynamic = tf.shape(t)
    return [d if d is not None else dynamic[i] for i, d in enumerate(static)]


def shift_axis(axis: tf.Tensor | int, rank: int | None = None, by: int = 1):
    """Renumber per-iteration axes for a value with ``by`` leading batch axes.

    Non-negative axes move right by ``by``; negative ones count from the end and stay.  A
    constant axis gives a constant (Python/NumPy) result so XLA sees a compile-time constant.
    """
    value = axis if isinstance(axis, (int, np.integer, list, tuple)) else static_value(axis)
    if value is not None:
        arr = np.asarray(value)
        out = np.where(arr >= 0, arr + by, arr).astype(
            arr.dtype if arr.dtype.kind == "i" else np.int32)
        return out
    axis = tf.convert_to_tensor(axis)
    return tf.where(axis >= 0, axis + tf.cast(by, axis.dtype), axis)


def normalize_axis(axis, rank: int):
    """Per-iteration axes as non-negative Python ints (axis must be constant)."""
    value = static_value(axis) if isinstance(axis, tf.Tensor) else axis
    if value is None:
        return None
    arr = np.asarray(value)
    return np.where(arr < 0, arr + rank, arr)


def expand_after_batch(t: tf.Tensor, k: int) -> tf.Tensor:
    """Insert ``k`` singleton axes after the batch axis: ``[n, *s] -> [n, 1.., *s]``."""
    if k <= 0:
        return t
    if t.shape.is_fully_defined():
        dims = t.shape.as_list()
        return tf.reshape(t, dims[:1] + [1] * k + dims[1:])
    shape = tf.shape(t)
    new_shape = tf.concat([shape[:1], tf.ones([k], tf.int32), shape[1:]], 0)
    out = tf.reshape(t, new_shape)
    if t.shape.rank is not None:
        out.set_shape(t.shape[:1].concatenate([1] * k).concatenate(t.shape[1:]))
    return out


def fold_batch(t: tf.Tensor, k: int = 1) -> tuple[tf.Tensor, tf.Tensor]:
    """``[n, a1..ak, *rest] -> [n*a1*..*ak, *rest]``; returns it and the folded leading shape.

    Static shapes give constant shape operands (fewer ops to trace, XLA-friendly).  When ``t``
    is itself an unfolding reshape of a folded value (:func:`folded_form`), that value is
    returned instead of a second reshape: a folded chain (conv -> bias -> relu -> pool -> conv)
    then stays 4-D, which is what lets grappler fuse it as it does hand-batched code.
    """
    src = folded_form(t) if k == 1 else None
    if src is not None:
        lead = (tf.constant(t.shape.as_list()[:2], tf.int32) if t.shape[:2].is_fully_defined()
                else tf.shape(t, out_type=tf.int32)[:2])
        return src, lead
    if t.shape.is_fully_defined():
        dims = t.shape.as_list()
        lead = dims[:k + 1]
        return tf.reshape(t, [int(np.prod(lead))] + dims[k + 1:]), tf.constant(lead, tf.int32)
    shape = tf.shape(t)
    lead = shape[:k + 1]
    flat = tf.reshape(t, tf.concat([[-1], shape[k + 1:]], 0))
    if t.shape.rank is not None:
        dims = t.shape.as_list()
        n = None if any(d is None for d in dims[:k + 1]) else int(np.prod(dims[:k + 1]))
        flat.set_shape([n] + dims[k + 1:])
    return flat, lead


def unfold_batch(t: tf.Tensor, lead: tf.Tensor, lead_static: Sequence[int | None] = None
                 ) -> tf.Tensor:
    """Inverse of :func:`fold_batch`: ``[N, *rest] -> [*lead, *rest]``."""
    lead_value = static_value(lead)
    if lead_value is not None and t.shape[1:].is_fully_defined():
        return tf.reshape(t, [int(d) for d in lead_value] + t.shape.as_list()[1:])
    out = tf.reshape(t, tf.concat([lead, tf.shape(t)[1:]], 0))
    if lead_static is not None and t.shape.rank is not None:
        out.set_shape(list(lead_static) + t.shape.as_list()[1:])
    return out


def folded_form(t: tf.Tensor) -> tf.Tensor | None:
    """``X`` when ``t = reshape(X, [n, b, *rest])`` with ``X`` of shape ``[N, *rest]``, else None.

    Such a ``t`` is what :func:`unfold_batch` makes of an op's output on iteration-folded
    inputs.  Reshapes keep row-major order, so ``fold_batch(t)`` *is* ``X``: taking it needs no
    op and is exact.  ``rest`` must be statically known and equal on both sides; ``X`` must
    live in the graph being built.
    """
    if tf.executing_eagerly() or not isinstance(t, tf.Tensor) or t.op.type != "Reshape":
        return None
    src = t.op.inputs[0]
    if (src.graph is not tf_ops.get_default_graph() or src.shape.rank is None
            or t.shape.rank is None or src.shape.rank < 1 or t.shape.rank != src.shape.rank + 1):
        return None
    rest = src.shape[1:]
    if not rest.is_fully_defined() or rest != t.shape[2:]:
        return None
    return src


def map_folded(t: tf.Tensor, fn: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor | None:
    """``fn`` applied to the folded form of ``t`` and unfolded again, or None (see
    :func:`folded_form`).  ``fn`` must act on each ``rest``-shaped row alone and keep shapes
    (bias add, relu, ...): then ``unfold(fn(X)) == fn(t)`` element for element.
    """
    src = folded_form(t)
    if src is None:
        return None
    out = fn(src)
    if out.shape.rank is not None and out.shape.rank != src.shape.rank:
        raise ValueError(f"map_folded: fn changed the rank ({src.shape} -> {out.shape})")
    unfolded = tf.reshape(out, t.op.inputs[1])  # t's own shape operand: no dependency on t
    unfolded.set_shape(t.shape)
    return unfolded


def move_axis(t: tf.Tensor, src: int, dst: int) -> tf.Tensor:
    """Move axis ``src`` to ``dst`` (ranks must be known)."""
    rank = t.shape.rank
    src, dst = src % rank, dst % rank
    if src == dst:
        return t
    perm = [i for i in range(rank) if i != src]
    perm.insert(dst, src)
    return tf.transpose(t, perm)


def per_iteration_rank(w: WrappedTensor) -> int | None:
    r = w.t.shape.rank
    if r is None:
        return None
    return r - 1 if w.is_stacked else r

# }}}


# {{{ families

def _family(op_types: Sequence[str], fn: Callable) -> None:
    """Register a family converter, attributed to the module that called the family helper."""
    fn.__module__ = sys._getframe(2).f_globals.get("__name__", fn.__module__)
    register_converter(*op_types)(fn)


def elementwise(*op_types: str) -> None:
    """Register unary ops that act on each element independently."""

    def _elementwise(x: ConversionInput):
        if len(x.inputs) == 1 and x.op.inputs[0].dtype == tf.variant:
            # Identity of a list: ``_replace`` keeps what a list value carries besides its
            # handle (the per-row element counts of ``lists.RowCountedList``).
            return [x.input(0)._replace(t=create_op_like(x.op, [x.input(0).t])[0])]
        if len(x.inputs) == 1 and same_static_shape(x.op.inputs[0], x.op.outputs[0]):
            out = map_folded(x.input(0).t, lambda t: create_op_like(x.op, [t])[0])
            if out is not None:
                return stacked(out)
        return reemit_stacked(x, [w.t for w in x.inputs])
    _family(op_types, _elementwise)


def align_ranks(x: ConversionInput, indices: Sequence[int] | None = None) -> list[tf.Tensor]:
    """Inputs ready for a broadcasting op: stacked ones get equal ranks, invariant ones untouched.

    Per iteration the inputs broadcast from the right.  A stacked ``[n, *s]`` value needs
    ``max_rank - len(s)`` singleton axes after the batch axis; a loop-invariant value of any
    rank <= max_rank already broadcasts correctly against ``[n, ...]``.
    """
    idx = list(range(len(x.inputs))) if indices is None else list(indices)
    ranks = [per_iteration_rank(x.inputs[i]) for i in idx]
    if any(r is None for r in ranks):  # (e.g. a value popped from a stack): at run time
        return _align_ranks_dynamic([x.inputs[i] for i in idx])
    max_rank = max(ranks)
    out = []
    for i, r in zip(idx, ranks):
        w = x.inputs[i]
        out.append(expand_after_batch(w.t, max_rank - r) if w.is_stacked else w.t)
    return out


def _align_ranks_dynamic(inputs: Sequence[WrappedTensor]) -> list[tf.Tensor]:
    """:func:`align_ranks` for inputs of unknown rank: singleton axes inserted at run time."""
    ranks = [tf.rank(w.t) - 1 if w.is_stacked else tf.rank(w.t) for w in inputs]
    max_rank = tf.reduce_max(tf.stack(ranks))
    out = []
    for w, r in zip(inputs, ranks):
        shape = tf.shape(w.t)
        out.append(tf.reshape(w.t, tf.concat([shape[:1], tf.ones([max_rank - r], tf.int32),
                                              shape[1:]], 0)) if w.is_stacked else w.t)
    return out


def _broadcast_on_folded(x: ConversionInput) -> tf.Tensor | None:
    """One stacked input with a folded form (:func:`folded_form`), invariant inputs that only
    broadcast over its trailing ``rest`` axes, and an output shaped like that input: run the op
    on the folded value (e.g. a dense layer's ``matmul + bias`` stays 2-D)."""
    idx = [i for i, w in enumerate(x.inputs) if w.is_stacked]
    if len(idx) != 1:
        return None
    s = idx[0]
    if not same_static_shape(x.op.inputs[s], x.op.outputs[0]) or x.op.outputs[0].shape.rank < 2:
        return None
    rest_rank = x.op.outputs[0].shape.rank - 1
    if any(w.t.shape.rank is None or w.t.shape.rank > rest_rank
           for i, w in enumerate(x.inputs) if i != s):
        return None

    def emit(folded: tf.Tensor) -> tf.Tensor:
        inputs = [w.t for w in x.inputs]
        inputs[s] = folded
        return create_op_like(x.op, inputs)[0]
    return map_folded(x.input(s).t, emit)


def broadcasting(*op_types: str) -> None:
    """Register n-ary ops with NumPy-style broadcasting of all inputs."""

    def _broadcasting(x: ConversionInput):
        folded = _broadcast_on_folded(x)
        if folded is not None:
            return stacked(folded)
        aligned = align_ranks(x)
        if aligned is None:
            return None
        return reemit_stacked(x, aligned)
    _family(op_types, _broadcasting)


def same_shape(*op_types: str) -> None:
    """Register n-ary ops whose inputs must all have the same shape: tile invariant ones."""

    def _same_shape(x: ConversionInput):
        ranks = {per_iteration_rank(w) for w in x.inputs}
        if len(ranks) != 1 or None in ranks:  # e.g. a scalar that the op broadcasts itself
            return None
        return reemit_stacked(x, [x.stacked_input(i) for i in range(len(x.inputs))])
    _family(op_types, _same_shape)


def reduction(*op_types: str, axis_input: int = 1) -> None:
    """Register ops reducing/scanning input 0 over the axes given by input ``axis_input``."""

    def _reduction(x: ConversionInput):
        if x.is_stacked(axis_input):
            return None
        if not x.is_stacked(0):
            return None
        inputs = [w.t for w in x.inputs]
        axis = shift_axis(inputs[axis_input])
        inputs[axis_input] = tf.constant(axis) if isinstance(axis, np.ndarray) else axis
        return reemit_stacked(x, inputs)
    _family(op_types, _reduction)

def batch_folding(*op_types: str) -> None:
    """Register ops whose input 0 is ``[batch, ...]`` with independent batch rows (images):
    fold ``[n, b, ...] -> [n*b, ...]``, run the op, unfold every output.  The other inputs
    must be loop-invariant."""

    def _batch_folding(x: ConversionInput):
        if not x.is_stacked(0) or any(w.is_stacked for w in x.inputs[1:]):
            return None
        flat, lead = fold_batch(x.input(0).t)
        outs = create_op_like(x.op, [flat] + [w.t for w in x.inputs[1:]])
        return stacked(*(unfold_batch(o, lead, x.input(0).t.shape[:2]) for o in outs))
    _family(op_types, _batch_folding)

# }}}


def assert_same_across(x: ConversionInput, per_iteration: tf.Tensor, what: str) -> tf.Tensor:
    """``per_iteration[0]``, after a run-time check that every iteration has the same value."""
    first = tf.cond(tf.size(per_iteration) > 0, lambda: per_iteration[0],
                    lambda: tf.zeros([], per_iteration.dtype)) if not x.vectorizer.xla \
        else per_iteration[0]
    check = tf.debugging.Assert(
        tf.reduce_all(tf.equal(per_iteration, first)),
        [runtime_message(x.op, what + " (a ragged result cannot be stacked); per-iteration "
                               "values:"), per_iteration], summarize=20)
    with tf.control_dependencies([check]):
        return tf.identity(first)


def loop_len_static(x: ConversionInput) -> int | None:
    """The number of iterations if it is known when the graph is built."""
    v = static_value(x.loop_len)
    return None if v is None else int(v)


def positions_of(t: tf.Tensor) -> tf.Tensor:
    """``[0, 1, ..., len(t) - 1]`` (int32) computed from ``t``'s values, not its length.

    Inside a loop whose variables change length (the active rows of a while loop with a
    loop-variant trip count), ``tf.range(tf.size(t))`` lets Grappler's constant folding pin
    the length to the loop's entry value; this form keeps it tied to ``t``.

    Example:
        >>> import tensorflow as tf
        >>> positions_of(tf.constant([7, 3, 9])).numpy().tolist()
        [0, 1, 2]
    """
    return tf.math.cumsum(tf.ones_like(t, dtype=tf.int32), exclusive=True)


def where_positions(mask: tf.Tensor) -> tf.Tensor:
    """The positions of the true entries of a ``[m]`` bool ``mask`` (int32 ``[k]``).

    Example:
        >>> import tensorflow as tf
        >>> where_positions(tf.constant([True, False, True])).numpy().tolist()
        [0, 2]
    """
    return tf.reshape(tf.cast(tf.where(mask), tf.int32), [-1])

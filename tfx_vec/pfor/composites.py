"""Values that are not plain tensors, on their way into and out of a vectorized loop.

Into ``vectorized_map`` (:func:`flatten_elems`): every leaf of ``elems`` becomes tensors with a
leading mapped axis plus a function that rebuilds one iteration's value from per-iteration
tensors.  A ``tf.RaggedTensor``, ``tf.SparseTensor`` or ``BatchableExtensionType`` travels as
the batched tensor list of its ``BatchableTypeSpec`` (one row per element), rebuilt in the
body by the unbatched spec -- as TensorFlow's ``vectorized_map`` gathers composites.
``tf.IndexedSlices`` are made dense; a leading dimension of 1 broadcasts against the others.

Out of the loop (:func:`assemble_leaf`): the stacked tensors standing for one output leaf
(see :class:`~tfx_vec.pfor.trace.Leaf`) become the batched value: a SparseTensor gains a
leading iteration dimension (indices ``[n*m, r+1]``, dense shape ``[n, max_i shape_i]``), a
composite is rebuilt by ``spec._batch(n)``.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> rt = tf.ragged.constant([[1, 2], [3, 4], [5, 6]])
    >>> tfx_vec.vectorized_map(lambda r: tf.reduce_sum(r), rt).numpy().tolist()
    [3, 7, 11]
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import tensorflow as tf

from tfx_vec.pfor.converters.parsing_ops import BatchedSparsePart, unbatch_inputs
from tfx_vec.pfor.registry import WrappedTensor, tile_to_stacked
from tfx_vec.pfor.trace import Leaf, composite_spec

__all__ = ["ElemLeaf", "flatten_elems", "assemble_leaf", "leading_size", "broadcast_leading"]


@dataclasses.dataclass
class ElemLeaf:
    """One leaf of ``elems``: its tensors, and how to rebuild one iteration's value.

    Example:
        >>> import tensorflow as tf
        >>> leaf = flatten_elems(tf.ones([4, 2]), True)
        >>> leaf.mapped, leaf.specs[0].shape
        (True, TensorShape([2]))
    """

    tensors: list            # each with the mapped axis first (when mapped)
    mapped: bool
    rebuild: Callable[[list], Any]
    specs: list              # per-iteration TensorSpec of each tensor


def _dense_leaf(x: tf.Tensor, mapped: bool) -> ElemLeaf:
    spec_shape = x.shape[1:] if mapped and x.shape.rank is not None else (
        tf.TensorShape(None) if mapped else x.shape)
    return ElemLeaf([x], mapped, lambda ts: ts[0], [tf.TensorSpec(spec_shape, x.dtype)])


def flatten_elems(leaf: Any, mapped: bool) -> ElemLeaf:
    """The tensors standing for one leaf of ``elems`` (axis already moved to 0 if mapped).

    Example:
        >>> import tensorflow as tf
        >>> leaf = flatten_elems(tf.ragged.constant([[1, 2], [3]]), True)
        >>> [t.dtype.name for t in leaf.tensors]       # one encoded row per element
        ['variant']
    """
    if isinstance(leaf, tf.IndexedSlices):
        leaf = tf.convert_to_tensor(leaf)
    if isinstance(leaf, tf.SparseTensor):
        spec = leaf._type_spec  # pylint: disable=protected-access
    else:
        spec = composite_spec(leaf)
    if spec is None:
        return _dense_leaf(tf.convert_to_tensor(leaf), mapped)
    if not mapped:
        comps = tf.nest.flatten(leaf, expand_composites=True)
        return ElemLeaf(comps, False,
                        lambda ts: tf.nest.pack_sequence_as(leaf, ts, expand_composites=True),
                        [tf.TensorSpec(c.shape, c.dtype) for c in comps])
    tensors = spec._to_batched_tensor_list(leaf)  # pylint: disable=protected-access
    unbatched = spec._unbatch()  # pylint: disable=protected-access
    flat_specs = unbatched._flat_tensor_specs  # pylint: disable=protected-access
    return ElemLeaf(list(tensors), True,
                    lambda ts: unbatched._from_compatible_tensor_list(ts),  # pylint: disable=protected-access
                    [tf.TensorSpec(s.shape, s.dtype) for s in flat_specs])


def leading_size(t: tf.Tensor):
    """The leading dimension of a mapped tensor: a Python int when static, else a tensor.

    Example:
        >>> import tensorflow as tf
        >>> leading_size(tf.zeros([3, 2]))
        3
    """
    if t.shape.rank is not None and t.shape[0] is not None:
        return int(t.shape[0])
    return tf.shape(t)[0]


def broadcast_leading(t: tf.Tensor, n) -> tf.Tensor:
    """``t`` with a leading dimension of 1 broadcast to ``n`` (``n`` rows stay as they are).

    Example:
        >>> import tensorflow as tf
        >>> broadcast_leading(tf.constant([[1, 2]]), 3).numpy().tolist()
        [[1, 2], [1, 2], [1, 2]]
    """
    if t.shape.rank is not None and t.shape[0] == n:
        return t
    shape = tf.shape(t)
    out = tf.broadcast_to(t, tf.concat([tf.reshape(tf.cast(n, shape.dtype), [1]), shape[1:]], 0))
    if t.shape.rank is not None:
        out.set_shape(tf.TensorShape([n if isinstance(n, int) else None]).concatenate(
            t.shape[1:]))
    return out


def _stacked(w: WrappedTensor, loop_len) -> tf.Tensor:
    return w.t if w.is_stacked else tile_to_stacked(w.t, loop_len)


def _sparse(indices: WrappedTensor, values: WrappedTensor, shape: WrappedTensor,
            loop_len) -> tf.SparseTensor:
    """Per-iteration sparse components -> one SparseTensor with a leading iteration axis."""
    parts = (indices, values, shape)
    if all(isinstance(w, BatchedSparsePart) for w in parts):
        return tf.SparseTensor(indices.t, values.t, shape.t)
    indices, values, shape = unbatch_inputs(parts, loop_len)
    idx = tf.cast(_stacked(indices, loop_len), tf.int64)            # [n, m, r]
    vals = _stacked(values, loop_len)                               # [n, m]
    shapes = tf.cast(_stacked(shape, loop_len), tf.int64)           # [n, r]
    n = tf.cast(loop_len, tf.int64)
    m = tf.shape(idx, out_type=tf.int64)[1]
    rank = tf.shape(idx, out_type=tf.int64)[2]
    rows = tf.repeat(tf.range(n), tf.fill(tf.reshape(n, [1]), m))[:, None]
    new_idx = tf.concat([rows, tf.reshape(idx, tf.stack([-1, rank]))], 1)
    # the largest dense shape of any iteration (a zero row keeps an empty loop valid)
    dense = tf.reduce_max(tf.concat([shapes, tf.zeros(tf.stack([1, rank]), tf.int64)], 0), 0)
    out = tf.SparseTensor(new_idx, tf.reshape(vals, [-1]), tf.concat([[n], dense], 0))
    r_static = indices.t.shape[-1] if indices.t.shape.rank else None
    if r_static is not None:
        out.indices.set_shape([None, r_static + 1])
        out.dense_shape.set_shape([r_static + 1])
    return out


def assemble_leaf(leaf: Leaf, outs: Sequence[WrappedTensor], loop_len, n_static,
                  side_effects: Sequence[tf.Operation] | None = None) -> Any:
    """The batched value of one output leaf from its stacked/invariant tensors.

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec.pfor.trace import Leaf
        >>> parts = [WrappedTensor(tf.constant([[[0]], [[1]]], tf.int64), True),
        ...          WrappedTensor(tf.constant([5.0]), False), WrappedTensor(tf.constant([2], tf.int64), False)]
        >>> sp = assemble_leaf(Leaf("sparse", (0, 1, 2)), parts, 2, 2)
        >>> tf.sparse.to_dense(sp).numpy().tolist()
        [[5.0, 0.0], [0.0, 5.0]]
    """
    if leaf.kind == "none":
        return None
    if leaf.kind == "op":
        return tf.group(*side_effects) if side_effects else tf.no_op()
    if leaf.kind == "sparse":
        return _sparse(*[outs[k] for k in leaf.slots], loop_len)
    tensors = [_stacked(w, loop_len)
               for w in unbatch_inputs([outs[k] for k in leaf.slots], loop_len)]
    batched = leaf.spec._batch(n_static)  # pylint: disable=protected-access
    return batched._from_compatible_tensor_list(tensors)  # pylint: disable=protected-access

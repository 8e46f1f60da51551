"""Converter for ``ParseExampleV2`` on one serialized ``tf.train.Example`` per iteration
(``tf.io.parse_single_example``): one ``ParseExampleV2`` of all of them.

Dense features come out stacked.  A sparse feature (``VarLenFeature``) may have a different
number of values in every iteration, which no stacked tensor can hold: its components are
kept as the batch parse returns them (:class:`BatchedSparsePart`: indices ``[N, 1 + r]``
whose first column is the iteration, values ``[N]``, dense shape ``[1 + r]``).  Returned from
the loop body (``Identity`` passes them on) they are the batched SparseTensor as they are;
any other op reading them gets the ordinary stacked form, after a run-time check that every
iteration has as many values (:func:`unbatch_inputs`).

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> ex = lambda *v: tf.train.Example(features=tf.train.Features(feature={"s": tf.train.Feature(
    ...     int64_list=tf.train.Int64List(value=v))})).SerializeToString()
    >>> data = tf.constant([ex(1, 2), ex(3)])
    >>> feats = {"s": tf.io.VarLenFeature(tf.int64)}
    >>> out = tfx_vec.pfor(lambda i: tf.io.parse_single_example(data[i], feats)["s"], 2)
    >>> tf.sparse.to_dense(out).numpy().tolist()
    [[1, 2], [3, 0]]
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfx_vec.pfor.errors import runtime_message
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

__all__ = ["BatchedSparsePart", "forward_batched", "unbatch_inputs"]

#: Ops that only pass a value on: a batched sparse component goes through them unchanged.
_FORWARDING = frozenset({"Identity"})


class BatchedSparsePart(WrappedTensor):
    """One component (``role``: ``"indices"``, ``"values"`` or ``"dense_shape"``) of the
    per-iteration SparseTensors of a sparse feature, batched: ``indices`` is the batched
    indices ``[N, 1 + r]`` (first column: the iteration) all components share; ``op``: the op
    of the loop body that made it (named by the run-time check of :meth:`stacked_form`).

    Example:
        >>> import tensorflow as tf
        >>> idx = tf.constant([[0, 0], [0, 1], [1, 0], [1, 1]], tf.int64)
        >>> BatchedSparsePart(idx, "indices", idx, None).stacked_form(2).numpy().tolist()
        [[[0], [1]], [[0], [1]]]
    """

    batched = True

    def __new__(cls, t: tf.Tensor, role: str, indices: tf.Tensor, op: tf.Operation | None):
        self = super().__new__(cls, t, True)
        self.role, self.indices, self.op = role, indices, op
        return self

    def _replace(self, **kw):
        return BatchedSparsePart(kw.get("t", self.t), self.role, self.indices, self.op)

    def stacked_form(self, loop_len) -> tf.Tensor:
        """The ordinary stacked value (``[n, m, r]``, ``[n, m]``, ``[n, r]``), after a run-time
        check that every iteration has the same number ``m`` of values."""
        n = tf.cast(loop_len, tf.int64)
        rows = self.indices[:, 0]
        counts = tf.math.bincount(rows, minlength=n, maxlength=n, dtype=tf.int64)
        m = tf.shape(rows, out_type=tf.int64)[0] // tf.maximum(n, 1)
        what = ("a sparse feature has a different number of values in different iterations "
                "(a ragged result cannot be stacked); return it from the loop body to keep "
                "it sparse; per-iteration counts:")
        check = tf.debugging.Assert(
            tf.reduce_all(tf.equal(counts, m)),
            [runtime_message(self.op, what) if self.op is not None else what, counts],
            summarize=20)
        with tf.control_dependencies([check]):
            if self.role == "indices":
                r = tf.shape(self.t, out_type=tf.int64)[1] - 1
                return tf.reshape(self.t[:, 1:], tf.stack([n, m, r]))
            if self.role == "values":
                return tf.reshape(self.t, tf.stack([n, m]))
            return tf.tile(self.t[None, 1:], tf.stack([n, 1]))


def forward_batched(op: tf.Operation, inputs: Sequence[WrappedTensor]) -> list | None:
    """``op``'s outputs when it just passes on a :class:`BatchedSparsePart` (else None).

    Example:
        >>> import tensorflow as tf
        >>> op = tf.function(lambda x: tf.identity(x)).get_concrete_function(
        ...     tf.TensorSpec([], tf.float32)).graph.get_operations()[1]
        >>> forward_batched(op, [WrappedTensor(tf.ones([2]), True)]) is None
        True
    """
    if op.type in _FORWARDING and len(inputs) == 1 and isinstance(inputs[0], BatchedSparsePart):
        w = inputs[0]
        return [w._replace(t=tf.identity(w.t))]
    return None


def unbatch_inputs(inputs: Sequence[WrappedTensor], loop_len) -> list[WrappedTensor]:
    """``inputs`` with every :class:`BatchedSparsePart` in its ordinary stacked form.

    Example:
        >>> import tensorflow as tf
        >>> unbatch_inputs([WrappedTensor(tf.ones([2]), True)], 2)[0].t.shape.as_list()
        [2]
    """
    return [WrappedTensor(w.stacked_form(loop_len), True)
            if isinstance(w, BatchedSparsePart) else w for w in inputs]


@register_converter("ParseExampleV2")
def _parse_example(x: ConversionInput):
    serialized = x.input(0)
    if not serialized.is_stacked or serialized.t.shape.rank != 1:
        return x.decline("only one serialized example per iteration (a scalar) is vectorized")
    if not x.require_invariant(*range(1, len(x.inputs))):
        return None
    if x.op.inputs[1].shape.as_list() != [0]:
        return x.decline("example names are not vectorized")
    num_sparse = x.attr("num_sparse")
    if len(x.attr("ragged_value_types")):
        return x.decline("ragged features are not vectorized")
    outs = tf.raw_ops.ParseExampleV2(
        serialized=serialized.t, names=x.input(1).t, sparse_keys=x.input(2).t,
        dense_keys=x.input(3).t, ragged_keys=x.input(4).t,
        dense_defaults=[w.t for w in x.inputs[5:]], num_sparse=num_sparse,
        sparse_types=x.attr("sparse_types"), ragged_value_types=[], ragged_split_types=[],
        dense_shapes=x.attr("dense_shapes"))
    indices, values, shapes, dense = outs[:4]
    sparse = [BatchedSparsePart(t, role, idx, x.op)
              for role, part in (("indices", indices), ("values", values),
                                 ("dense_shape", shapes))
              for t, idx in zip(part, indices)]
    return sparse + [WrappedTensor(t, True) for t in dense]

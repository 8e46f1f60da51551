"""Converters for the variant encoding of RaggedTensors (ragged ``elems`` and outputs).

``vectorized_map`` over a RaggedTensor hands each iteration a row decoded from a variant
(``RaggedTensorFromVariant``), and a body that returns a RaggedTensor encodes it
(``RaggedTensorToVariant``, see ``trace.py``).  Both are vectorized when every iteration's
ragged value has the same component sizes (the same number of rows at each level, and of
values) -- the case where its components can be stacked:

- ``RaggedTensorFromVariant`` decodes all iterations at once (one more ragged dimension), then
  cuts each level's row splits and the values into per-iteration rows: iteration ``i`` owns a
  contiguous range at every level, starting where its rows of the level above start.  Sizes
  that differ across iterations are a run-time error naming the op (a ragged result cannot be
  stacked); a value that is ragged *within* an iteration is fine.
- ``RaggedTensorToVariant`` of stacked components builds the batch (splits offset by each
  iteration's start) and encodes it with ``batched_input=True``: one variant per iteration.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> rt = tf.ragged.constant([[[1, 2], [3]], [[4], [5, 6]]])   # rows: 2 x ragged
    >>> tfx_vec.vectorized_map(lambda r: r.flat_values * 10, rt,
    ...                        fallback_to_while_loop=False).numpy().tolist()
    [[10, 20, 30], [40, 50, 60]]
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import assert_same_across, stacked
from tfx_vec.pfor.converters.nn_ops import converter
from tfx_vec.pfor.registry import ConversionInput

__all__: list[str] = []


def _rows(x: ConversionInput, splits: tf.Tensor, starts: tf.Tensor, counts: tf.Tensor):
    """Each iteration's ``count + 1`` split entries from ``starts``, made to start at 0;
    returns them and the next level's (starts, counts)."""
    count = assert_same_across(x, counts, "the number of rows of a ragged level")
    idx = starts[:, None] + tf.range(count + 1, dtype=starts.dtype)[None, :]   # [n, c+1]
    rows = tf.gather(splits, idx)
    return rows - rows[:, :1], rows[:, 0], rows[:, -1] - rows[:, 0]


@converter("RaggedTensorFromVariant")
def _from_variant(x: ConversionInput):
    if x.op.inputs[0].shape.rank not in (0, None) or x.attr("input_ragged_rank") not in (-1, 0):
        return x.decline("only one ragged value per iteration is decoded here")
    ragged_rank = x.attr("output_ragged_rank")
    decoded = tf.raw_ops.RaggedTensorFromVariant(
        encoded_ragged=x.input(0).t, input_ragged_rank=ragged_rank,
        output_ragged_rank=ragged_rank + 1,
        Tvalues=x.attr("Tvalues"), Tsplits=x.attr("Tsplits"))
    splits, values = decoded.output_nested_splits, decoded.output_dense_values
    starts, counts = splits[0][:-1], splits[0][1:] - splits[0][:-1]
    out = []
    for level in splits[1:]:
        rows, starts, counts = _rows(x, level, starts, counts)
        out.append(rows)
    count = assert_same_across(x, counts, "the number of values of a ragged tensor")
    idx = starts[:, None] + tf.range(count, dtype=starts.dtype)[None, :]
    return stacked(*out, tf.gather(values, idx))


@converter("RaggedTensorToVariant")
def _to_variant(x: ConversionInput):
    if x.attr("batched_input"):
        return x.decline("a batch of ragged values per iteration")
    ragged_rank = x.attr("RAGGED_RANK")
    levels = [x.stacked_input(k) for k in range(ragged_rank)]             # [n, L_k + 1]
    values = x.stacked_input(ragged_rank)                                  # [n, V, ...]
    n = tf.shape(values, out_type=levels[0].dtype)[0]
    sizes = [tf.shape(s, out_type=s.dtype)[1] - 1 for s in levels] + [
        tf.shape(values, out_type=levels[0].dtype)[1]]
    batch = [tf.range(n + 1, dtype=levels[0].dtype) * sizes[0]]
    for s, below in zip(levels, sizes[1:]):
        offsets = tf.range(n, dtype=s.dtype)[:, None] * below
        batch.append(tf.concat([tf.reshape(s[:, :-1] + offsets, [-1]), [n * below]], 0))
    flat_values = tf.reshape(values, tf.concat([[-1], tf.shape(values)[2:]], 0))
    return stacked(tf.raw_ops.RaggedTensorToVariant(rt_nested_splits=batch,
                                                    rt_dense_values=flat_values,
                                                    batched_input=True))

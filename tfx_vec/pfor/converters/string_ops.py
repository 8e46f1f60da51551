"""Converters for printing, string formatting and CSV parsing.

As in TensorFlow's pfor, printing inside the loop prints the *stacked* values once (not once
per iteration): ``tf.print(x)`` in the body prints ``[x_0 x_1 ...]``; ``StringFormat`` formats
the stacked tensors into one (loop-invariant) string, and the v1 ``Print`` op passes its
first input through, stacked, printing its data once.  ``DecodeCSV`` parses records of any
shape, so the stacked records are parsed by one op.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> lines = tf.constant([["1,2"], ["3,4"]])
    >>> out = tfx_vec.pfor(lambda i: tf.io.decode_csv(tf.gather(lines, i), [[0], [0]]), 2,
    ...                    fallback_to_while_loop=False)
    >>> [o.numpy().tolist() for o in out]
    [[[1], [3]], [[2], [4]]]
"""
from __future__ import annotations

from tfx_vec.pfor.converters._helpers import create_op_like, reemit_stacked
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

__all__: list[str] = []


@register_converter("StringFormat")
def _string_format(x: ConversionInput):
    return [WrappedTensor(t, False) for t in create_op_like(x.op, [w.t for w in x.inputs])]


@register_converter("Print")
def _print(x: ConversionInput):
    return reemit_stacked(x, [x.stacked_input(0)] + [w.t for w in x.inputs[1:]])


@register_converter("DecodeCSV")
def _decode_csv(x: ConversionInput):
    if not x.require_invariant(*range(1, len(x.inputs))):
        return None
    return reemit_stacked(x, [w.t for w in x.inputs])

"""Converters for ``tf.experimental.Optional`` values (``OptionalFromValue`` and friends).

A loop-variant optional is one optional holding the stacked components (like a stacked
TensorList, its handle stays a scalar): ``OptionalFromValue`` stacks every component (tiling
invariant ones), ``OptionalGetValue`` returns them stacked, and ``OptionalHasValue`` is the
same in every iteration.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> def body(i):
    ...     return tf.experimental.Optional.from_value(i * 2).get_value()
    >>> tfx_vec.pfor(body, 3, fallback_to_while_loop=False).numpy().tolist()
    [0, 2, 4]
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import create_op_like, stacked
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

__all__: list[str] = []


@register_converter("OptionalFromValue")
def _from_value(x: ConversionInput):
    components = [x.stacked_input(i) for i in range(len(x.inputs))]
    return stacked(*create_op_like(x.op, components))


@register_converter("OptionalGetValue")
def _get_value(x: ConversionInput):
    n = tf.get_static_value(x.loop_len)
    shapes = [tf.TensorShape([n]).concatenate(tf.TensorShape(s))
              for s in x.attr("output_shapes")]
    return stacked(*create_op_like(x.op, [x.input(0).t], attrs={
        "output_shapes": _shape_list_attr(shapes)}))


@register_converter("OptionalHasValue")
def _has_value(x: ConversionInput):
    return [WrappedTensor(t, False) for t in create_op_like(x.op, [x.input(0).t])]


def _shape_list_attr(shapes):
    from tensorflow.core.framework import attr_value_pb2
    a = attr_value_pb2.AttrValue()
    a.list.shape.extend(s.as_proto() for s in shapes)
    return a

"""Converters for resource variables (paper §3.8).

- Idempotent ops (``VarHandleOp``, ``ReadVariableOp``, ``VariableShape``, ``VarIsInitializedOp``)
  run once; their outputs are loop-invariant.  ``ResourceGather`` with loop-variant indices is
  one read and one gather.
- Commutative, associative updates (``AssignAddVariableOp``, ``AssignSubVariableOp``) of a
  loop-variant value reduce the updates over the iterations first and apply the sum once; a
  loop-invariant value is applied ``n`` times, i.e. once scaled by ``n``.
- ``AssignVariableOp`` of a loop-invariant value writes it once (``n`` identical writes); of a
  loop-variant value it is a :class:`~tfx_vec.VectorizationError` naming the op, since the
  per-iteration loop's result would depend on the order of the iterations.  So is any other
  write (``ResourceScatter*``, ``ResourceApply*``) whose inputs depend on the loop index.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> v = tf.Variable(0.0)
    >>> _ = tfx_vec.pfor(lambda i: v.assign_add(tf.cast(i, tf.float32)), 4)
    >>> float(v.numpy())
    6.0
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import create_op_like
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []


def _resource_invariant(x: ConversionInput) -> None:
    if x.is_stacked(0):
        raise x.error("the variable handle depends on the loop index; pfor needs every "
                      "iteration to use the same variable")


@register_converter("VarHandleOp", "ReadVariableOp", "VariableShape", "VarIsInitializedOp")
def _convert_idempotent(x: ConversionInput):
    if x.inputs:
        _resource_invariant(x)
    return [WrappedTensor(t, False) for t in create_op_like(x.op, [w.t for w in x.inputs])]


@register_converter("ResourceGather")
def _convert_resource_gather(x: ConversionInput):
    _resource_invariant(x)
    if not x.is_stacked(1):
        return [WrappedTensor(create_op_like(x.op, [w.t for w in x.inputs])[0], False)]
    if x.attr("batch_dims") != 0:
        return None
    # Gathering with [n, *idx] indices gives [n, *idx, *row] = the stacked per-iteration result.
    return [WrappedTensor(create_op_like(x.op, [x.inputs[0].t, x.inputs[1].t])[0], True)]


@register_converter("AssignAddVariableOp", "AssignSubVariableOp")
def _convert_accumulate(x: ConversionInput):
    _resource_invariant(x)
    value = x.inputs[1]
    if value.is_stacked:
        total = tf.reduce_sum(value.t, axis=0)
    else:
        total = value.t * tf.cast(x.loop_len, value.t.dtype)
    create_op_like(x.op, [x.inputs[0].t, total])
    return []


@register_converter("AssignVariableOp")
def _convert_assign(x: ConversionInput):
    _resource_invariant(x)
    if x.is_stacked(1):
        raise x.error("assigning a value that depends on the loop index to a variable shared "
                      "by all iterations (the result would depend on the iteration order); "
                      "return the values from the loop body instead, or use assign_add/assign_sub")
    create_op_like(x.op, [w.t for w in x.inputs])
    return []


#: Writes that are idempotent when nothing depends on the loop index (n equal writes = one).
_IDEMPOTENT_WRITES = ("ResourceScatterUpdate", "ResourceScatterNdUpdate",
                      "ResourceStridedSliceAssign")
#: Writes whose n-fold repetition is not one write (and no reduction of the updates applies).
_OTHER_WRITES = ("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
                 "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
                 "ResourceScatterNdAdd", "ResourceScatterNdSub",
                 "ResourceApplyGradientDescent", "ResourceApplyAdam", "ResourceApplyMomentum",
                 "ResourceApplyKerasMomentum", "ResourceApplyAdagrad", "ResourceApplyRMSProp")


@register_converter(*_IDEMPOTENT_WRITES, *_OTHER_WRITES)
def _convert_other_write(x: ConversionInput):
    if not x.any_stacked and x.op_type in _IDEMPOTENT_WRITES:
        create_op_like(x.op, [w.t for w in x.inputs])
        return []
    raise x.error("this write to a variable shared by all iterations cannot be vectorized "
                  "(the result would depend on the iteration order); only assign_add/"
                  "assign_sub of loop-variant values and writes of loop-invariant values can")

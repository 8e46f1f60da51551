"""Python's arithmetic operators and variable updates on the lazy device, recorded without
TensorFlow's op wrappers.

``m * 0.9``, ``g + h`` or ``v / c`` on a tensor of the lazy device runs TensorFlow's Python
operator machinery (a name scope, dtype promotion, the Python number converted to a host
tensor, API dispatch, the generated op function, the eager fast path) before the device
records one op: about 25 µs an operator, where recording it costs two.  An update written op
by op, such as the Adam of TensorFlow's core tutorials, is mostly such operators.

:func:`install` gives ``tf.Tensor``'s eager tensors and resource variables operators
``+ - * / **`` that first offer the operation to the device (``record``; a device variable's
operand is read by the device too, and its ``assign``, ``assign_add`` and ``assign_sub`` of a
device tensor are offered likewise), which records it directly where that is the same as
TensorFlow's path: both operands on the device or one a Python or NumPy number, float32 or
float64, the op already recorded once on operands of the same signatures, eager execution
under the device's scope or none, with no gradient tape, forward accumulator or op callback
to observe it, and TensorFlow's default dtype conversion.  Everything else, and every tensor
that is not on the device, goes through TensorFlow's own operator, looked up when called.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     x = tf.constant([1.0, 2.0]) + 0.0
    ...     y = [x * 0.5 for _ in range(3)][-1]   # the first records the recipe
    >>> y.numpy().tolist()
    [0.5, 1.0]
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import context
from tensorflow.python.framework import ops, tensor as tensor_lib
from tensorflow.python.ops import resource_variable_ops

__all__ = ["install", "OPERATORS", "NUMBERS", "UPDATES"]

# Python operator -> (TensorFlow op, operands swapped: ``2.0 * x`` is Mul(2.0, x))
OPERATORS = {
    "__add__": ("AddV2", False), "__radd__": ("AddV2", True),
    "__sub__": ("Sub", False), "__rsub__": ("Sub", True),
    "__mul__": ("Mul", False), "__rmul__": ("Mul", True),
    "__truediv__": ("RealDiv", False), "__rtruediv__": ("RealDiv", True),
    "__pow__": ("Pow", False), "__rpow__": ("Pow", True),
}

# The numbers TensorFlow converts to the tensor's dtype by value (bool is not one of them)
NUMBERS = frozenset({float, int, np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                     np.int64, np.uint8, np.uint16, np.uint32, np.uint64})

Record = Callable[[str, Any, Any, bool, Callable[[], bool]], Any]
Read = Callable[[Any, Callable[[], bool]], Any]
Update = Callable[[str, Any, Any, Callable[[], bool]], bool]

# A resource variable's update method -> its op
UPDATES = {"assign": "AssignVariableOp", "assign_add": "AssignAddVariableOp",
           "assign_sub": "AssignSubVariableOp"}
_installed = [False]


def install(record: Record, read: Read, update: Update) -> None:
    """Route the operators of eager tensors and resource variables through ``record(op type,
    eager tensor, other operand, swapped, observed)`` first: its result, or TensorFlow's
    operator when it returns None (idempotent).  ``record`` calls ``observed()`` once it knows
    the tensor is its own (tensors elsewhere do not pay for the check).  A variable operand is
    read by ``read(variable, observed)``, or by ``variable.value()`` where that returns None.
    A variable's ``assign``, ``assign_add`` and ``assign_sub`` of an eager tensor try
    ``update(op type, variable, tensor, observed)`` first (False: TensorFlow's method)."""
    if _installed[0]:
        return
    _installed[0] = True
    for name, (op_type, swapped) in OPERATORS.items():
        on_tensor = _tensor_operator(name, op_type, swapped, record)
        setattr(ops.EagerTensor, name, on_tensor)
        setattr(resource_variable_ops.BaseResourceVariable, name,
                _variable_operator(on_tensor, read))
    for cls in (resource_variable_ops.BaseResourceVariable, resource_variable_ops.ResourceVariable):
        for name, op_type in UPDATES.items():
            if name in vars(cls):     # TensorFlow wraps ResourceVariable's own for weak types
                setattr(cls, name, _variable_update(vars(cls)[name], op_type, update))


def _observed() -> bool:
    """Whether anything besides the device sees each op: graph building, a gradient tape or
    forward accumulator, an op callback, a dtype conversion mode other than the default."""
    return not context.executing_eagerly() or not pywrap_tfe.TFE_Py_TapeSetIsEmpty() or \
        bool(context.context().op_callbacks) or \
        ops.get_dtype_conversion_mode() is not ops.PromoMode.OFF


def _tensor_operator(name: str, op_type: str, swapped: bool, record: Record) -> Callable:
    def operator(x, y):
        kind = type(y)
        if kind is ops.EagerTensor or kind in NUMBERS:
            out = record(op_type, x, y, swapped, _observed)
            if out is not None:
                return out
        return getattr(tensor_lib.Tensor, name)(x, y)
    operator.__name__ = operator.__qualname__ = name
    return operator


def _variable_operator(on_tensor: Callable, read: Read) -> Callable:
    # As TensorFlow's own: the operator of the variable's value (a read).
    def operator(v, y):
        value = read(v, _observed)
        return on_tensor(v.value() if value is None else value, y)
    operator.__name__ = operator.__qualname__ = on_tensor.__name__
    return operator


def _variable_update(original: Callable, op_type: str, update: Update) -> Callable:
    def method(self, value, use_locking=None, name=None, read_value=True):
        if type(value) is ops.EagerTensor and update(op_type, self, value, _observed):
            # What TensorFlow's method returns eagerly: the variable to be read, or None.
            return self._lazy_read(None) if read_value else None
        return original(self, value, use_locking, name, read_value)
    method.__name__ = method.__qualname__ = original.__name__
    method.__doc__ = original.__doc__
    method.__wrapped__ = original
    return method

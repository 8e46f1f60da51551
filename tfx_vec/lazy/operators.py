"""Python's arithmetic and comparison operators and variable updates on the lazy device,
recorded without TensorFlow's op wrappers.

``m * 0.9``, ``g + h`` or ``v / c`` on a tensor of the lazy device runs TensorFlow's Python
operator machinery (a name scope, dtype promotion, the Python number converted to a host
tensor, API dispatch, the generated op function, the eager fast path) before the device
records one op: about 25 µs an operator, where recording it costs two.  An update written op
by op, such as the Adam of TensorFlow's core tutorials, is mostly such operators, and so is
a forward pass written with them under a ``tf.GradientTape``.

:func:`install` gives ``tf.Tensor``'s eager tensors and resource variables operators
``+ - * / **``, ``< <= > >=`` and unary ``-`` that first offer the operation to the device
(``record``; a device variable's operand is read by the device too, and its ``assign``,
``assign_add`` and ``assign_sub`` of a device tensor, or of a number for a scalar variable,
are offered likewise), which records it directly where that is the same as TensorFlow's path: a
float32 or float64 operand on the device, the other on the device too, a host tensor of the
same dtype or a Python or NumPy number, the op already recorded once on operands of the same
signatures, eager execution under the device's scope or none, no op callback to observe it, and
TensorFlow's default dtype conversion. A gradient tape or forward accumulator that is recording
gets the op (or the read) as TensorFlow's fast path gives it one (``TFE_Py_RecordGradient``,
with the op's inputs, attrs and outputs); updates under one take TensorFlow's path. Everything
else, and every pair of tensors neither of which is on the device, goes through TensorFlow's
own operator, looked up when called. A device variable's ``numpy()`` reads its host resource at
once (after its pending updates), instead of recording a read and an ``Identity`` on the device
and forcing them.

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

__all__ = ["install", "watchers", "OPERATORS", "UNARY", "NUMBERS", "UPDATES", "FREE", "TAPED",
           "BLOCKED"]

# Python operator -> (TensorFlow op, operands swapped: ``2.0 * x`` is Mul(2.0, x))
OPERATORS = {
    "__add__": ("AddV2", False), "__radd__": ("AddV2", True),
    "__sub__": ("Sub", False), "__rsub__": ("Sub", True),
    "__mul__": ("Mul", False), "__rmul__": ("Mul", True),
    "__truediv__": ("RealDiv", False), "__rtruediv__": ("RealDiv", True),
    "__pow__": ("Pow", False), "__rpow__": ("Pow", True),
    # ``2.0 < x`` is Python's ``x.__gt__(2.0)``: comparisons have no swapped forms
    "__gt__": ("Greater", False), "__ge__": ("GreaterEqual", False),
    "__lt__": ("Less", False), "__le__": ("LessEqual", False),
}
UNARY = {"__neg__": "Neg"}

# The numbers TensorFlow converts to the tensor's dtype by value (bool is not one of them)
NUMBERS = frozenset({float, int, np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                     np.int64, np.uint8, np.uint16, np.uint32, np.uint64})

# What besides the device sees an op issued now (``watchers()``): nothing; a gradient tape or
# forward accumulator, which records it as TensorFlow's fast path would; or something only
# TensorFlow's own path serves (graph building, an op callback, a dtype conversion mode).
FREE, TAPED, BLOCKED = 0, 1, 2
Watchers = Callable[[], int]
Record = Callable[[str, Any, Any, bool, Watchers], Any]
RecordUnary = Callable[[str, Any, Watchers], Any]
Read = Callable[[Any, Watchers], Any]
Update = Callable[[str, Any, Any, Watchers], bool]
Value = Callable[[Any], Any]

# A resource variable's update method -> its op
UPDATES = {"assign": "AssignVariableOp", "assign_add": "AssignAddVariableOp",
           "assign_sub": "AssignSubVariableOp"}
_installed = [False]


def install(record: Record, record_unary: RecordUnary, read: Read, update: Update,
            value: Value) -> None:
    """Route the operators of eager tensors and resource variables through ``record(op type,
    eager tensor, other operand, swapped, watchers)`` first: its result, or TensorFlow's
    operator when it returns None (idempotent); unary ``-`` likewise through
    ``record_unary(op type, eager tensor, watchers)``.  ``record`` calls ``watchers()`` once
    it knows an operand is its own (tensors elsewhere do not pay for the check).  A variable
    operand is read by ``read(variable, watchers)``, or by ``variable.value()`` where that
    returns None. A variable's ``assign``, ``assign_add`` and ``assign_sub`` of an eager
    tensor or a number try ``update(op type, variable, value, watchers)`` first (False:
    TensorFlow's method), and its ``numpy()`` is ``value(variable).numpy()`` where that is
    not None."""
    if _installed[0]:
        return
    _installed[0] = True
    for name, (op_type, swapped) in OPERATORS.items():
        on_tensor = _tensor_operator(name, op_type, swapped, record, read)
        setattr(ops.EagerTensor, name, on_tensor)
        setattr(resource_variable_ops.BaseResourceVariable, name,
                _variable_operator(on_tensor, read))
    for name, op_type in UNARY.items():
        on_tensor = _unary_operator(name, op_type, record_unary)
        setattr(ops.EagerTensor, name, on_tensor)
        setattr(resource_variable_ops.BaseResourceVariable, name,
                _variable_unary(on_tensor, read))
    for cls in (resource_variable_ops.BaseResourceVariable, resource_variable_ops.ResourceVariable):
        for name, op_type in UPDATES.items():
            if name in vars(cls):     # TensorFlow wraps ResourceVariable's own for weak types
                setattr(cls, name, _variable_update(vars(cls)[name], op_type, update))
    base = resource_variable_ops.BaseResourceVariable
    base.numpy = _variable_numpy(base.numpy, value)


def watchers() -> int:
    """What besides the device sees each op issued now: :data:`BLOCKED` while building a graph,
    with an op callback or a dtype conversion mode other than the default; :data:`TAPED` while
    a gradient tape or forward accumulator records; else :data:`FREE`."""
    if not context.executing_eagerly() or context.context().op_callbacks or \
            ops.get_dtype_conversion_mode() is not ops.PromoMode.OFF:
        return BLOCKED
    return FREE if pywrap_tfe.TFE_Py_TapeSetIsEmpty() else TAPED


def _tensor_operator(name: str, op_type: str, swapped: bool, record: Record,
                     read: Read) -> Callable:
    def operator(x, y):
        kind = type(y)
        if kind is not ops.EagerTensor and kind not in NUMBERS:
            if not isinstance(y, resource_variable_ops.BaseResourceVariable):
                return getattr(tensor_lib.Tensor, name)(x, y)
            value = read(y, watchers)    # TensorFlow's operator would read it too
            if value is None:
                return getattr(tensor_lib.Tensor, name)(x, y)
            y = value
        out = record(op_type, x, y, swapped, watchers)
        return getattr(tensor_lib.Tensor, name)(x, y) if out is None else out
    operator.__name__ = operator.__qualname__ = name
    return operator


def _variable_operator(on_tensor: Callable, read: Read) -> Callable:
    # As TensorFlow's own: the operator of the variable's value (a read).
    def operator(v, y):
        value = read(v, watchers)
        return on_tensor(v.value() if value is None else value, y)
    operator.__name__ = operator.__qualname__ = on_tensor.__name__
    return operator


def _unary_operator(name: str, op_type: str, record_unary: RecordUnary) -> Callable:
    def operator(x):
        out = record_unary(op_type, x, watchers)
        return getattr(tensor_lib.Tensor, name)(x) if out is None else out
    operator.__name__ = operator.__qualname__ = name
    return operator


def _variable_unary(on_tensor: Callable, read: Read) -> Callable:
    def operator(v):
        value = read(v, watchers)
        return on_tensor(v.value() if value is None else value)
    operator.__name__ = operator.__qualname__ = on_tensor.__name__
    return operator


def _variable_numpy(original: Callable, value: Value) -> Callable:
    def numpy(self):
        got = value(self)
        return original(self) if got is None else got.numpy()
    numpy.__doc__ = original.__doc__
    numpy.__wrapped__ = original
    return numpy


def _variable_update(original: Callable, op_type: str, update: Update) -> Callable:
    def method(self, value, use_locking=None, name=None, read_value=True):
        if (type(value) is ops.EagerTensor or type(value) in NUMBERS or
                isinstance(value, resource_variable_ops.BaseResourceVariable)) and \
                update(op_type, self, value, watchers):
            # What TensorFlow's method returns eagerly: the variable to be read, or None.
            return self._lazy_read(None) if read_value else None
        return original(self, value, use_locking, name, read_value)
    method.__name__ = method.__qualname__ = original.__name__
    method.__doc__ = original.__doc__
    method.__wrapped__ = original
    return method

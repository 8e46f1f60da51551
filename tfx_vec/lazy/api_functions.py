"""TensorFlow's reductions, reshapes, casts and a few activations on the lazy device, recorded
without their Python wrappers once TensorFlow's own path has shown what they record.

``tf.reduce_mean(x)`` runs about 50 µs of Python before the device records one op: the
deprecation and dispatch wrappers, the reduction axes worked out and converted to a host
tensor, the generated op function and its fast path (``tf.reshape`` of a Python shape falls
back to TensorFlow's slow conversion path: about 60 µs).  A loss written with them pays that
every step, eagerly or on the lazy device alike, where the op itself costs two to record.

:func:`install` replaces the functions of :data:`FUNCTIONS` in TensorFlow's modules by
wrappers that first offer the call to the device (``record``).  The device answers from what
the same call recorded before: the first call with given arguments (the tensor's shape and
dtype, the other arguments' Python values) takes TensorFlow's path, and the op it recorded
(one op on the tensor and baked constants) is kept; a later call with the same arguments
records that op again directly, and gives it to recording gradient tapes as TensorFlow's fast
path gives it.  Where the device does not answer (a tensor elsewhere, an argument that is a
tensor, graph building, an op callback) TensorFlow's function runs, as it always does outside
the device.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     x = tf.constant([[1.0, 2.0], [3.0, 4.0]]) * 1.0
    ...     means = [tf.reduce_mean(x, axis=1) for _ in range(3)]   # the first shows the op
    >>> means[-1].numpy().tolist()
    [1.5, 3.5]
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.ops import array_ops, math_ops, nn_ops

__all__ = ["install", "FUNCTIONS"]

# TensorFlow API function -> (TensorFlow's module defining it, its name there, the op it
# records on its first argument)
FUNCTIONS = {
    "reduce_sum": (math_ops, "reduce_sum", "Sum"),
    "reduce_mean": (math_ops, "reduce_mean", "Mean"),
    "reduce_max": (math_ops, "reduce_max", "Max"),
    "reduce_min": (math_ops, "reduce_min", "Min"),
    "reduce_prod": (math_ops, "reduce_prod", "Prod"),
    "reshape": (array_ops, "reshape", "Reshape"),
    "transpose": (array_ops, "transpose_v2", "Transpose"),
    "expand_dims": (array_ops, "expand_dims_v2", "ExpandDims"),
    "squeeze": (array_ops, "squeeze_v2", "Squeeze"),
    "cast": (math_ops, "cast", "Cast"),
    "sigmoid": (math_ops, "sigmoid", "Sigmoid"),
    "abs": (math_ops, "abs", "Abs"),
    "nn.softmax": (nn_ops, "softmax_v2", "Softmax"),
    "nn.log_softmax": (nn_ops, "log_softmax_v2", "LogSoftmax"),
}
# ``record(function name, op type, first argument, other positional arguments, keyword
# arguments, TensorFlow's call)``: the device's answer, or None for TensorFlow's path.
Record = Callable[[str, str, Any, tuple, dict, Callable[[], Any]], Any]
_installed = [False]


def _api_modules() -> list:
    """The modules the functions are reached through: TensorFlow's own and its API's."""
    return [math_ops, array_ops, nn_ops, tf, tf.math, tf.nn, tf.compat.v1, tf.compat.v1.math,
            tf.compat.v1.nn]


def install(record: Record) -> None:
    """Replace each function of :data:`FUNCTIONS`, under every name a module of TensorFlow's
    API holds it by, by a wrapper that calls ``record`` first (idempotent)."""
    if _installed[0]:
        return
    _installed[0] = True
    modules = _api_modules()
    for name, (home, attribute, op_type) in FUNCTIONS.items():
        original = getattr(home, attribute)
        wrapper = _wrapper(name, op_type, original, record)
        for module in modules:
            for held, value in list(vars(module).items()):
                if value is original:
                    setattr(module, held, wrapper)


def _wrapper(name: str, op_type: str, original: Callable, record: Record) -> Callable:
    @functools.wraps(original)
    def function(*args, **kwargs):
        if args:
            out = record(name, op_type, args[0], args[1:], kwargs,
                         lambda: original(*args, **kwargs))
            if out is not None:
                return out
        return original(*args, **kwargs)
    return function

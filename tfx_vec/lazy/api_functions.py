"""TensorFlow's reductions, reshapes, casts, products, activations, losses, gathers and
slicing on the lazy device, recorded without their Python wrappers once TensorFlow's own path
has shown what they record.

``tf.reduce_mean(x)`` runs about 50 µs of Python before the device records one op: the
deprecation and dispatch wrappers, the reduction axes worked out and converted to a host
tensor, the generated op function and its fast path (``tf.reshape`` of a Python shape falls
back to TensorFlow's slow conversion path: about 60 µs;
``tf.nn.sigmoid_cross_entropy_with_logits``, ten ops each through the same wrappers: about
200 µs).  A loss written with them pays that every step, eagerly or on the lazy device alike,
where recording an op costs two.

:func:`install` replaces the functions of :data:`FUNCTIONS` in TensorFlow's modules by
wrappers that first offer the call to the device (``record``).  The device answers from what
the same call recorded before: the first call with given arguments (each tensor's shape and
dtype and whether it is on the device, which arguments are the same tensor, the other
arguments' Python values) takes TensorFlow's path, and the ops it recorded on its tensor
arguments and on constants it made itself are kept as a template; a later call with the
same arguments records them again directly, each given to recording gradient tapes as
TensorFlow's fast path gives it.  Where the device does not answer (no tensor of the device,
an argument that is a tensor of another kind, graph building, an op callback) or the first
call did something a template cannot repeat (read a value, ran an op on the host, used a
tensor or variable from outside the call) TensorFlow's function runs, as it always does
outside the device.

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
from tensorflow.python.framework import ops, tensor as tensor_lib
from tensorflow.python.ops import array_ops, linalg_ops, math_ops, nn_impl, nn_ops

__all__ = ["install", "FUNCTIONS", "METHODS", "INDEX_ARGUMENTS"]

# TensorFlow API function -> (TensorFlow's module defining it, its name there)
FUNCTIONS = {
    "reduce_sum": (math_ops, "reduce_sum"), "reduce_mean": (math_ops, "reduce_mean"),
    "reduce_max": (math_ops, "reduce_max"), "reduce_min": (math_ops, "reduce_min"),
    "reduce_prod": (math_ops, "reduce_prod"),
    "math.reduce_logsumexp": (math_ops, "reduce_logsumexp"),
    "math.reduce_variance": (math_ops, "reduce_variance"),
    "math.reduce_std": (math_ops, "reduce_std"),
    "reshape": (array_ops, "reshape"), "transpose": (array_ops, "transpose_v2"),
    "expand_dims": (array_ops, "expand_dims_v2"), "squeeze": (array_ops, "squeeze_v2"),
    "cast": (math_ops, "cast"), "matmul": (math_ops, "matmul"),
    "argmax": (math_ops, "argmax_v2"), "norm": (linalg_ops, "norm_v2"),
    "sigmoid": (math_ops, "sigmoid"), "abs": (math_ops, "abs"),
    "math.log_sigmoid": (math_ops, "log_sigmoid"),
    "nn.softmax": (nn_ops, "softmax_v2"), "nn.log_softmax": (nn_ops, "log_softmax_v2"),
    "nn.l2_loss": (nn_ops, "l2_loss"),
    "nn.sigmoid_cross_entropy_with_logits": (nn_impl, "sigmoid_cross_entropy_with_logits_v2"),
    "nn.softmax_cross_entropy_with_logits": (nn_ops, "softmax_cross_entropy_with_logits_v2"),
    "nn.sparse_softmax_cross_entropy_with_logits":
        (nn_ops, "sparse_softmax_cross_entropy_with_logits_v2"),
    "gather": (array_ops, "gather_v2"), "one_hot": (array_ops, "one_hot"),
    "equal": (math_ops, "equal"), "not_equal": (math_ops, "not_equal"),
}
# Tensor methods -> (TensorFlow's class defining them, the name there): installed on eager
# tensors.  ``x[0]``, ``x[:, 1:]``: TensorFlow's slicing builds its begin, end and strides
# from the Python index through about 80 µs of Python (a loss picking a column, a step taking
# the first row of a batch).
METHODS = {"Tensor.__getitem__": (tensor_lib.Tensor, "__getitem__")}
# The functions whose integer tensor arguments (host batches of labels or indices) TensorFlow's
# path only passes to ops as data (never reads in Python): a template takes them by
# signature, like a float batch.
INDEX_ARGUMENTS = frozenset({"nn.sparse_softmax_cross_entropy_with_logits", "gather",
                             "one_hot", "equal", "not_equal"})
# ``record(function name, TensorFlow's function, positional arguments, keyword arguments)``:
# the device's answer (after calling the function itself, where it learns from that), or None
# for TensorFlow's path.
Record = Callable[[str, Callable, tuple, dict], Any]
_installed = [False]


def _api_modules() -> list:
    """The modules the functions are reached through: TensorFlow's own and its API's."""
    return [math_ops, array_ops, linalg_ops, nn_impl, nn_ops, tf, tf.math, tf.nn, tf.linalg,
            tf.compat.v1, tf.compat.v1.math, tf.compat.v1.nn, tf.compat.v1.linalg]


def install(record: Record) -> None:
    """Replace each function of :data:`FUNCTIONS`, under every name a module of TensorFlow's
    API holds it by, and each method of :data:`METHODS` on eager tensors, by a wrapper that
    calls ``record`` first (idempotent)."""
    if _installed[0]:
        return
    _installed[0] = True
    modules = _api_modules()
    for name, (home, attribute) in FUNCTIONS.items():
        original = getattr(home, attribute)
        wrapper = _wrapper(name, original, record)
        for module in modules:
            for held, value in list(vars(module).items()):
                if value is original:
                    setattr(module, held, wrapper)
    for name, (cls, attribute) in METHODS.items():
        setattr(ops.EagerTensor, attribute,
                _wrapper(name, getattr(cls, attribute), record, _tensorflow_slicing))


def _wrapper(name: str, original: Callable, record: Record,
             offered: Callable[[], bool] = lambda: True) -> Callable:
    """``original`` offered to ``record`` first, while ``offered()``."""
    @functools.wraps(original)
    def function(*args, **kwargs):
        out = record(name, original, args, kwargs) if offered() else None
        return original(*args, **kwargs) if out is None else out
    return function


def _tensorflow_slicing() -> bool:
    """False under NumPy behaviour (``tf.experimental.numpy.experimental_enable_numpy_behavior``),
    whose slicing TensorFlow's ``__getitem__`` switches to by a flag a key would not see."""
    return not getattr(ops, "_numpy_style_slicing", False)

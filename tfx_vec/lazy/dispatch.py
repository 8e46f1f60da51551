"""Wiring into TensorFlow's dispatch: ``tf.*`` calls on lazy tensors record instead of run.

- every op of ``ops.OPS`` whose API supports type-based dispatch gets a ``dispatch_for_api``
  target with one signature per tensor parameter (a lazy tensor there) and per list parameter
  (a list holding one), so the call reaches :func:`tensor.record`;
- a global fallback dispatcher (TensorFlow's "v1" dispatch, tried when an API fails to convert
  a lazy tensor) records ops without type-based dispatch (``tf.einsum``) and sends every other
  op to ``runtime.fallback``: forced inputs, the op run eagerly, counted per op;
- ``tf.shape``/``tf.size``/``tf.rank`` answer from static shapes (no forcing) and
  ``tf.convert_to_tensor`` forces.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec.lazy.tensor import tensor
    >>> tf.shape(tensor([[1.0, 2.0]])).numpy().tolist()
    [1, 2]
"""
from __future__ import annotations

import sys
import typing

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import math_ops
from tensorflow.python.util import dispatch as tf_dispatch

from . import runtime
from .ops import BY_API, OPS, OpDef
from .tensor import LazyTensor, record, value

__all__ = ["install", "COVERED"]

_ELEMENT = typing.Union[LazyTensor, tf.Tensor, np.ndarray, float, int, bool]
COVERED: list[str] = []          # ops reachable through tf.* (filled by install)
_installed = [False]


def _target(op: OpDef):
    def target(*args, **kwargs):
        return record(op, args, kwargs)
    target.__name__ = f"lazy_{op.name.replace('.', '_')}"
    return target


class _GlobalDispatcher(tf_dispatch.GlobalOpDispatcher):
    """Catches any dispatchable tf API that failed on a lazy argument."""

    def handle(self, op, args, kwargs):
        flat = tf.nest.flatten((args, kwargs))
        if not any(isinstance(x, LazyTensor) for x in flat):
            return self.NOT_SUPPORTED
        opdef = BY_API.get(id(op))
        if opdef is not None:
            return record(opdef, args, kwargs)
        name = getattr(op, "__name__", repr(op))
        return runtime.fallback(name, op, args, kwargs)


def _static_shape(fn):
    def target(input, out_type=None, name=None):  # noqa: A002 (TF's parameter name)
        dims = input.shape.as_list()
        result = fn(dims)
        return tf.constant(result, out_type or tf.int32)
    return target


_MACHINERY = ("/tensorflow/python/util/", "/tensorflow/python/ops/weak_tensor_ops.py",
              "/tensorflow/python/framework/tensor_conversion")
_LIBRARIES = ("/tensorflow/", "/keras/", "/tf_keras/", "/tensorflow_probability/")


def _library_caller() -> str | None:
    """The TensorFlow/Keras function that called ``tf.convert_to_tensor``, if not user code."""
    f = sys._getframe(2)
    while f is not None and any(m in f.f_code.co_filename for m in _MACHINERY):
        f = f.f_back
    if f is not None and any(lib in f.f_code.co_filename for lib in _LIBRARIES):
        return f.f_code.co_name
    return None


def install() -> None:
    """Register the dispatchers (idempotent)."""
    if _installed[0]:
        return
    _installed[0] = True
    tf_dispatch.register_dispatchable_type(LazyTensor)
    for op in OPS.values():
        if op.name == "getitem":
            continue
        if hasattr(op.api, tf_dispatch.TYPE_BASED_DISPATCH_ATTR):
            sigs = [{p: LazyTensor} for p in op.tensors]
            sigs += [{p: typing.List[_ELEMENT]} for p in op.lists]
            tf.experimental.dispatch_for_api(op.api, *sigs)(_target(op))
        COVERED.append(op.name)
    # ``tf.Tensor.__add__`` calls this private wrapper (string concatenation aside, math.add):
    # without it ``eager_tensor + lazy`` would fall back while ``lazy + eager_tensor`` records.
    BY_API[id(math_ops._add_dispatch)] = OPS["math.add"]
    BY_API[id(math_ops.tensor_equals)] = OPS["math.equal"]          # eager_tensor == lazy
    BY_API[id(math_ops.tensor_not_equals)] = OPS["math.not_equal"]
    _GlobalDispatcher().register()
    tf.experimental.dispatch_for_api(tf.shape, {"input": LazyTensor})(
        _static_shape(lambda d: d))
    tf.experimental.dispatch_for_api(tf.size, {"input": LazyTensor})(
        _static_shape(lambda d: int(np.prod(d))))

    @tf.experimental.dispatch_for_api(tf.rank, {"input": LazyTensor})
    def _rank(input, name=None):  # noqa: A002
        return tf.constant(input.ndim, tf.int32)

    @tf.experimental.dispatch_for_api(tf.convert_to_tensor, {"value": LazyTensor})
    def _convert(*args, **kwargs):
        bound = dict(zip(("value", "dtype"), args), **kwargs)
        library_api = _library_caller()
        if library_api is not None:  # a TF/Keras API without a lazy rule converts its input
            runtime.count_fallback(library_api, "converts its lazy input to a tf.Tensor")
        out = value(bound["value"], "tf.convert_to_tensor")
        dtype = bound.get("dtype")
        return out if dtype is None else tf.cast(out, dtype)
    COVERED.extend(["shape", "size", "rank", "convert_to_tensor"])

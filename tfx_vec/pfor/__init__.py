"""``tfx_vec.pfor``: static vectorization of parallel-for loops over TF graphs.

The module itself is callable — ``tfx_vec.pfor(loop_fn, iters)`` is :func:`api.pfor` — while
``tfx_vec.pfor.vectorized_map``, ``register_converter``, ``fallback_report`` and the
submodules stay importable.

Pipeline (one module per stage): ``trace`` (loop body → FuncGraph) → ``vectorizer`` (greedy
walk, converters from ``registry`` / ``converters/``, per-op loop fallback) → ``api``
(binding, chunking, eager caching).

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> tfx_vec.pfor(lambda i: tf.range(3) * i, 2).numpy().tolist()
    [[0, 0, 0], [0, 1, 2]]
"""
import sys
import types

from tensorflow.python.autograph.core import config as _ag_config

from tfx_vec.pfor.errors import PforError, VectorizationError
from tfx_vec.pfor.registry import (ConversionInput, WrappedTensor, lookup, register_converter,
                                   registered_op_types)
from tfx_vec.pfor.vectorizer import FallbackReport, Vectorizer, fallback_report, reset_fallbacks
from tfx_vec.pfor.api import cache_stats, pfor, vectorized_map
from tfx_vec.pfor.trace import PforConfig
from tfx_vec.pfor import data  # noqa: F401  (``tfx_vec.pfor.data.map_and_batch``, no import needed)
from tfx_vec.pfor.gradients import batch_jacobian, hessian, jacobian, per_example_gradients

__all__ = ["pfor", "vectorized_map", "register_converter", "lookup", "registered_op_types",
           "VectorizationError", "PforError", "WrappedTensor", "ConversionInput", "Vectorizer",
           "fallback_report", "reset_fallbacks", "FallbackReport", "PforConfig", "cache_stats",
           "jacobian", "batch_jacobian", "hessian", "per_example_gradients", "data"]


class _CallableModule(types.ModuleType):
    """Makes ``tfx_vec.pfor(loop_fn, iters)`` call :func:`tfx_vec.pfor.api.pfor`."""

    def __call__(self, loop_fn, iters, **kwargs):
        return pfor(loop_fn, iters, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

# AutoGraph must not convert this library's own code when pfor is called inside a
# tf.function (TF exempts itself the same way): converting it costs seconds per first call.
# The user's loop body is still converted, by trace.py, when the caller has AutoGraph on.
if not any(getattr(r, "_prefix", None) == __name__ for r in _ag_config.CONVERSION_RULES):
    _ag_config.CONVERSION_RULES = (_ag_config.DoNotConvert(__name__),) + tuple(
        _ag_config.CONVERSION_RULES)

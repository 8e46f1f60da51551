"""tfx_vec.lazy: LazyTensor mode.  Eager-style TF code is recorded, cut at barriers, compiled
with XLA and cached (after "LazyTensor: combining eager execution with domain-specific
compilers", and PyTorch/XLA's ``mark_step``/``metrics_report``).

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> w = lazy.Variable(tf.ones([3, 2]))
    >>> x = lazy.tensor(tf.ones([4, 3]))
    >>> with lazy.GradientTape() as tape:
    ...     loss = tf.reduce_mean(tf.nn.relu(x @ w))
    >>> _ = w.assign_sub(0.1 * tape.gradient(loss, w))
    >>> lazy.mark_step()
    >>> round(float(loss), 4)
    3.0
    >>> "compiles" in lazy.metrics()
    True

Pipeline (one module per stage): ``tensor`` (LazyTensor, operators, forcing points, ``record``)
-> ``ops`` (the op table, argument binding, shape inference) -> ``ir`` (frozen nodes, canonical
key) -> ``runtime`` (live tensors, barrier, LRU cache, ``max_graphs``, fallback) -> ``lowering``
(replay in ``tf.function(jit_compile=True)``) -> ``metrics``.  ``dispatch`` wires ``tf.*`` in,
``tape`` adds gradients.
"""
from __future__ import annotations

from typing import Any

from . import dispatch as _dispatch
from . import ir as _ir
from .errors import (LazyCompileError, LazyError, LazyFallbackError, LazyGradientError,
                     LazyRecompilationError, LazyShapeError)
from .metrics import metrics, metrics_report, reset_metrics
from .runtime import barrier as _barrier
from .runtime import clear_cache, configure
from .tape import GradientTape
from .tensor import LazyTensor, Variable, tensor, value

__all__ = ["LazyTensor", "Variable", "tensor", "to_tensor", "mark_step", "GradientTape",
           "metrics", "metrics_report", "reset_metrics", "ir_text", "configure",
           "set_fallback_error", "clear_cache", "covered_ops", "LazyError",
           "LazyFallbackError", "LazyRecompilationError", "LazyShapeError", "LazyCompileError",
           "LazyGradientError"]

_dispatch.install()


def mark_step() -> None:
    """The barrier: compile (or hit the cache) and run everything pending, in one program."""
    _barrier("mark_step")


def to_tensor(t: Any) -> Any:
    """The eager ``tf.Tensor`` value of a lazy tensor (a forcing point)."""
    return value(t, "to_tensor")


def set_fallback_error(flag: bool = True) -> None:
    """Make eager fallbacks (ops with no lazy rule) raise :class:`LazyFallbackError`."""
    configure(fallback_error=flag)


def ir_text(*tensors: LazyTensor) -> str:
    """The pending IR behind ``tensors``, one node per line with shapes (paper, Figure 1)."""
    return _ir.text([t._node for t in tensors])


def covered_ops() -> list[str]:
    """The tf APIs (paths under ``tf.``) that record lazily."""
    return sorted(_dispatch.COVERED)

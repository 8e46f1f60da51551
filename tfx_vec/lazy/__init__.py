"""tfx_vec.lazy: lazy tensors.  Eager TensorFlow code is recorded instead of executed, cut at
barriers, compiled with XLA and cached (after "LazyTensor: combining eager execution with
domain-specific compilers", with PyTorch/XLA's ``mark_step`` and ``metrics_report``).

Two ways in.  ``with lazy.device():`` runs unchanged programs (``tf.Variable``, ``tf.Module``,
``tf.GradientTape``, Keras models, losses, metrics and optimizers) lazily on a TensorFlow
custom device; ``lazy.tensor`` / ``lazy.Variable`` / ``lazy.GradientTape`` are the explicit
forms, lazy tensors of their own outside any scope.  Either way ``lazy.mark_step()`` ends a
step and reading a value forces pending work.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     w = tf.Variable(tf.ones([3, 2]))
    ...     x = tf.ones([4, 3])
    ...     with tf.GradientTape() as tape:
    ...         loss = tf.reduce_mean(tf.nn.relu(x @ w))
    ...     _ = w.assign_sub(0.1 * tape.gradient(loss, w))
    ...     lazy.mark_step()
    >>> round(float(loss), 4)
    3.0

Pipeline (one module per stage): ``custom_device`` (the device's callbacks; ``raw`` knows each
TensorFlow op) and ``tensor``/``dispatch``/``ops`` (the explicit forms) record -> ``ir``
(frozen nodes, canonical key) -> ``runtime`` (live tensors, barrier, caches, fallback) ->
``lowering`` (replay in ``tf.function(jit_compile=True)``); ``tape``, ``tape_capture`` and
``calls`` record gradients and Keras optimizer updates as single nodes; ``metrics`` counts.
"""
from __future__ import annotations

from typing import Any

from . import dispatch as _dispatch
from . import ir as _ir
from .errors import (LazyCompileError, LazyError, LazyFallbackError, LazyGradientError,
                     LazyRecompilationError, LazyShapeError)
from . import metrics as _metrics
from . import runtime as _runtime
from .metrics import fallback_sites, recompilations, reset_metrics
from .runtime import barrier as _barrier
from .runtime import clear_cache, configure
from . import custom_device as _custom_device
from .custom_device import device
from .tape import GradientTape
from .tensor import LazyTensor, Variable, tensor, value

__all__ = ["device", "LazyTensor", "Variable", "tensor", "to_tensor", "mark_step", "wait", "GradientTape",
           "metrics", "metrics_report", "reset_metrics", "fallback_sites", "recompilations", "ir_text", "configure",
           "set_fallback_error", "clear_cache", "covered_ops", "LazyError",
           "LazyFallbackError", "LazyRecompilationError", "LazyShapeError", "LazyCompileError",
           "LazyGradientError"]

_dispatch.install()


def mark_step(wait: bool = True) -> None:
    """The barrier: compile (or find in the cache) and run everything pending, in one program.

    Call it once per training step.  ``wait=False`` runs a cached program asynchronously, as
    PyTorch/XLA's ``mark_step``: the call returns once it is launched and Python records the
    next step while XLA runs (the run releases the GIL); any use of a result waits for it.

    >>> import tensorflow as tf
    >>> x = tensor([1.0, 2.0]) * 3.0
    >>> mark_step()
    >>> x.numpy().tolist(), metrics()["executions"] >= 1
    ([3.0, 6.0], True)
    """
    _runtime.check_no_strategy("lazy.mark_step()")
    _barrier("mark_step", wait_for_results=wait)
    if wait:
        _runtime.wait()


def wait() -> None:
    """Block until the asynchronously launched program has finished (``xm.wait_device_ops``).

    >>> x = tensor([1.0]) + 1.0
    >>> mark_step(wait=False)
    >>> wait()
    >>> x.numpy().tolist()
    [2.0]
    """
    _runtime.wait()


def metrics() -> dict:
    """Counters and timers as a dict (after waiting for a running program): ``compiles``,
    ``cache_hits``, ``executions``, ``barriers``, ``forced``, ``fallback::<op>``... (see
    :mod:`tfx_vec.lazy.metrics`).

    >>> reset_metrics()
    >>> _ = (tensor([2.0]) * 2.0).numpy()
    >>> m = metrics(); m["forced"], m["executions"]
    (1, 1)
    """
    _runtime.wait()
    return _metrics.metrics()


def metrics_report() -> str:
    """A readable report: counters, each eager fallback with the lines that called it, the cause
    of each recompilation, timers.

    >>> print(metrics_report().splitlines()[0])
    lazy metrics report
    """
    _runtime.wait()
    return _metrics.metrics_report()


def to_tensor(t: Any) -> Any:
    """The eager ``tf.Tensor`` value of a lazy tensor (a forcing point).

    >>> to_tensor(tensor([1, 2]) + 1).numpy().tolist()
    [2, 3]
    """
    return value(t, "to_tensor")


def set_fallback_error(flag: bool = True) -> None:
    """Make every eager fallback (an op recorded nowhere, run eagerly) a
    :class:`LazyFallbackError` naming the op and the line that called it.

    >>> import tensorflow as tf
    >>> set_fallback_error(True)
    >>> try:
    ...     tf.unique(tensor([3.0, 1.0, 3.0]))
    ... except LazyFallbackError as e:
    ...     print("unique" in str(e))
    True
    >>> set_fallback_error(False)
    """
    configure(fallback_error=flag)


def ir_text(*tensors: Any) -> str:
    """The pending IR behind ``tensors`` (lazy tensors, or tensors on the lazy device), one node
    per line with shapes (the paper's Figure 1).

    >>> print(ir_text(tensor([1.0, 2.0]) * 3.0))
    IR {
      %0 = f32[2] data()
      %1 = f32[] scalar(), value=3.0
      %2 = f32[2] math.multiply(%0, %1), ROOT=0
    }
    """
    nodes = []
    for t in tensors:
        payload = t if isinstance(t, LazyTensor) else _custom_device.payload_of(t)
        if payload is None:
            raise TypeError(f"lazy.ir_text takes lazy tensors, got {type(t).__name__}")
        nodes.append(payload._node)
    return _ir.text(nodes)


def covered_ops() -> list[str]:
    """The tf APIs (paths under ``tf.``) that the explicit lazy tensors record (inside
    ``lazy.device()`` every TensorFlow op with an XLA kernel records).

    >>> "matmul" in covered_ops() and "nn.relu" in covered_ops()
    True
    """
    return sorted(_dispatch.COVERED)

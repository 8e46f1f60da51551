"""Errors raised by ``tfx_vec.lazy``; every message names the op and, where known, the user line.

Example:
    >>> issubclass(LazyFallbackError, LazyError)
    True
"""
from __future__ import annotations

__all__ = ["LazyError", "LazyFallbackError", "LazyRecompilationError", "LazyShapeError",
           "LazyCompileError", "LazyGradientError"]


class LazyError(RuntimeError):
    """Root of every error raised by the lazy tensor runtime.

    >>> from tfx_vec import lazy
    >>> import tensorflow as tf
    >>> w = lazy.Variable([1.0])
    >>> try:
    ...     tf.function(lambda: w * 2.0, autograph=False)()
    ... except lazy.LazyError as e:
    ...     print("tf.function" in str(e))
    True
    """

    # AutoGraph re-raises an error from traced code as its own type only when the type takes
    # the message as Exception does; otherwise the user would see a StagingError.
    __init__ = Exception.__init__


class LazyFallbackError(LazyError):
    """An op that cannot be recorded (no XLA kernel, a value-dependent output shape) was called
    while fallbacks are errors; the message names the op and the line that called it.

    >>> from tfx_vec import lazy
    >>> import tensorflow as tf
    >>> lazy.set_fallback_error(True)
    >>> try:
    ...     tf.unique(lazy.tensor([2.0, 2.0]))
    ... except lazy.LazyFallbackError as e:
    ...     print(str(e).split(" has ")[0])
    tf.unique
    >>> lazy.set_fallback_error(False)
    """


class LazyRecompilationError(LazyError):
    """More programs were compiled than ``lazy.configure(max_graphs=N)`` allows; the message
    says what differs from the last program compiled at the same barrier.

    >>> from tfx_vec import lazy
    >>> lazy.clear_cache(); _ = lazy.configure(max_graphs=1)
    >>> (lazy.tensor([1.0]) * 2.0).numpy().tolist()
    [2.0]
    >>> try:
    ...     (lazy.tensor([1.0, 2.0]) * 2.0).numpy()
    ... except lazy.LazyRecompilationError as e:
    ...     print("max_graphs=1" in str(e))
    True
    >>> _ = lazy.configure(max_graphs=None)
    """


class LazyShapeError(LazyError, ValueError):
    """An op's inputs have shapes or dtypes the op rejects, found while recording (the message
    names the op and the user's line).

    >>> from tfx_vec import lazy
    >>> try:
    ...     lazy.tensor([[1.0, 2.0]]) @ lazy.tensor([[1.0, 2.0]])
    ... except lazy.LazyShapeError as e:
    ...     print(str(e).split(":")[0])
    tf.matmul
    """


class LazyCompileError(LazyError):
    """Lowering or running a recorded program failed; the message names the program's ops.

    >>> issubclass(LazyCompileError, LazyError)
    True
    """


class LazyGradientError(LazyError):
    """A gradient was asked for something that cannot be differentiated (a non-persistent tape
    used twice, sources that are not lazy, a ``tf.Module`` of ``lazy.Variable``\\s).

    >>> from tfx_vec import lazy
    >>> w = lazy.Variable([2.0])
    >>> with lazy.GradientTape() as tape:
    ...     loss = w * w
    >>> _ = tape.gradient(loss, w)
    >>> try:
    ...     tape.gradient(loss, w)
    ... except lazy.LazyGradientError as e:
    ...     print("persistent" in str(e))
    True
    """

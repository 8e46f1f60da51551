"""Errors raised by ``tfx_vec.autobatch``.

Every error the user can cause derives from :class:`AutobatchError`.  Front-end errors name the
user's file and line; runtime errors name the batch members concerned.

Example:
    >>> from tfx_vec.autobatch.errors import AutobatchError, UnsupportedSyntaxError
    >>> issubclass(UnsupportedSyntaxError, AutobatchError)
    True
"""
from __future__ import annotations

__all__ = ["AutobatchError", "UnsupportedSyntaxError", "TypeInferenceError",
           "StackOverflowError", "MaxStepsExceededError", "PrimitiveError"]


class AutobatchError(Exception):
    """Root of all autobatch errors: wrong calls, unsupported code, typing, runtime limits.

    Example:
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def inc(n):
        ...     return n + 1
        >>> try:
        ...     inc(5)
        ... except ab.AutobatchError as e:
        ...     print(str(e).split(".")[0])
        inc(5): no argument has a batch dimension
    """


class UnsupportedSyntaxError(AutobatchError):
    """The front end met Python it does not batch (``try``, ``with``, ``yield``, ...); the
    message names the file and line.

    Example:
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def first(xs):
        ...     for x in xs:
        ...         return x
        ...     return xs
        >>> try:
        ...     first([[1, 2]])
        ... except ab.UnsupportedSyntaxError as e:
        ...     print(str(e).split(": ", 1)[1])
        only `for <name> in range(...)` loops are supported (in first)
    """


class TypeInferenceError(AutobatchError):
    """Abstract evaluation could not give a variable one dtype, shape and structure.

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def mixed(n):
        ...     y = n
        ...     if n > 0:
        ...         y = tf.cast(n, tf.float32)
        ...     return y
        >>> try:
        ...     mixed([1, -1])
        ... except ab.TypeInferenceError as e:
        ...     print("different dtype" in str(e))
        True
    """


class StackOverflowError(AutobatchError):
    """Some batch members recursed deeper than ``max_stack_depth`` (the message lists them).

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def depth(n):
        ...     if n <= 0:
        ...         return tf.zeros_like(n)
        ...     return depth(n - 1) + 1
        >>> try:
        ...     depth([2, 40], max_stack_depth=8)
        ... except ab.StackOverflowError as e:
        ...     print("members [1]" in str(e))
        True
    """


class MaxStepsExceededError(AutobatchError):
    """Some batch members had not finished after ``max_steps`` steps of the runtime loop.

    Example:
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def forever(n):
        ...     while n > 0:
        ...         n = n + 1
        ...     return n
        >>> try:
        ...     forever([3], max_steps=20)
        ... except ab.MaxStepsExceededError as e:
        ...     print(str(e).split(";")[0])
        forever: batch members [0] had not finished after max_steps=20 steps
    """


class PrimitiveError(AutobatchError):
    """A primitive (the user's straight-line code) raised; the message names its source line.

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def bad(n):
        ...     return tf.reshape(n, [7])
        >>> try:
        ...     bad([1, 2])
        ... except ab.PrimitiveError as e:
        ...     print("`return tf.reshape(n, [7])` failed" in str(e))
        True
    """

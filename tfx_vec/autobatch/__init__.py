"""tfx_vec.autobatch: batch Python functions with if/while/recursion (see README.md).

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def collatz_steps(n):
    ...     steps = tf.zeros_like(n)
    ...     while n > 1:
    ...         if n % 2 == 0:
    ...             n = n // 2
    ...         else:
    ...             n = 3 * n + 1
    ...         steps += 1
    ...     return steps
    >>> collatz_steps(tf.constant([1, 6, 7])).numpy().tolist()
    [0, 8, 16]
"""
from .api import AutobatchFunction, describe, function
from .errors import (AutobatchError, MaxStepsExceededError, PrimitiveError, StackOverflowError,
                     TypeInferenceError, UnsupportedSyntaxError)

__all__ = ["function", "describe", "AutobatchFunction", "AutobatchError",
           "UnsupportedSyntaxError", "TypeInferenceError", "StackOverflowError",
           "MaxStepsExceededError", "PrimitiveError"]

from tfx_vec.autobatch.nuts import NoUTurnSampler  # noqa: E402  (issue #5)

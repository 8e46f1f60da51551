"""tfx_vec.autobatch: batch a Python function written for one example -- with data-dependent
``if``/``while``/``for``, ``break``/``continue``, early ``return`` and recursion -- over the
leading dimension of its arguments (Radul et al., "Automatically batching control-intensive
programs for modern accelerators": local-static and program-counter autobatching).

Public names:

* :func:`function` (``@ab.function``): the decorator; :class:`AutobatchFunction` what it makes;
* :func:`describe`: print a batched function's compiled program;
* :func:`on_active_members`: mark an expensive function of a program to be computed only for
  the members at the block calling it (gathered in chunks; program-counter runtime);
* :class:`NoUTurnSampler`: a recursive NUTS batched by this compiler, as a TFP
  ``TransitionKernel`` (imported on first use: it needs TensorFlow Probability), and
  :func:`windowed_adaptive_nuts`: its warm-up of step size and diagonal mass matrix;
* the errors, all subclasses of :class:`AutobatchError`: :class:`UnsupportedSyntaxError`,
  :class:`TypeInferenceError`, :class:`StackOverflowError`, :class:`MaxStepsExceededError`,
  :class:`PrimitiveError`.

See ``docs/autobatch.md`` for the guide.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def gcd(a, b):
    ...     while b != 0:
    ...         a, b = b, a % b
    ...     return a
    >>> gcd([12, 35, 7], [18, 21, 5]).numpy().tolist()
    [6, 7, 1]
"""
from .api import AutobatchFunction, describe, function
from .errors import (AutobatchError, MaxStepsExceededError, PrimitiveError, StackOverflowError,
                     TypeInferenceError, UnsupportedSyntaxError)
from .gathered import on_active_members

__all__ = ["function", "describe", "on_active_members", "AutobatchFunction", "NoUTurnSampler",
           "windowed_adaptive_nuts", "AutobatchError", "UnsupportedSyntaxError",
           "TypeInferenceError", "StackOverflowError", "MaxStepsExceededError", "PrimitiveError"]


def __getattr__(name: str):
    # NUTS needs TensorFlow Probability (and through it tf_keras): imported on first use only
    if name in ("NoUTurnSampler", "windowed_adaptive_nuts"):
        from . import nuts
        return getattr(nuts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # help() and dir() list the lazily imported sampler with the rest
    return sorted(set(globals()) | set(__all__))

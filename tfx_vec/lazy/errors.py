"""Errors raised by ``tfx_vec.lazy``; every message names the op and, where known, the user line.

Example:
    >>> issubclass(LazyFallbackError, LazyError)
    True
"""
from __future__ import annotations

__all__ = ["LazyError", "LazyFallbackError", "LazyRecompilationError", "LazyShapeError",
           "LazyCompileError", "LazyGradientError"]


class LazyError(RuntimeError):
    """Root of every error raised by the lazy tensor runtime."""

    # AutoGraph re-raises an error from traced code as its own type only when the type takes
    # the message as Exception does; otherwise the user would see a StagingError.
    __init__ = Exception.__init__


class LazyFallbackError(LazyError):
    """An op with no lazy recording rule was called while fallbacks are errors."""


class LazyRecompilationError(LazyError):
    """More distinct programs were compiled than the ``max_graphs`` guard allows."""


class LazyShapeError(LazyError, ValueError):
    """An op's inputs have shapes or dtypes the op rejects (found while recording)."""


class LazyCompileError(LazyError):
    """Lowering or XLA compilation of a recorded program failed."""


class LazyGradientError(LazyError):
    """``lazy.GradientTape.gradient`` was asked for something it cannot differentiate."""

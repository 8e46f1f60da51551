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
    """Root of all autobatch errors."""


class UnsupportedSyntaxError(AutobatchError):
    """The front end met Python it does not batch (``try``, ``with``, ``yield``, ...)."""


class TypeInferenceError(AutobatchError):
    """Abstract evaluation could not give a variable one dtype/shape/structure."""


class StackOverflowError(AutobatchError):
    """Some batch members recursed deeper than ``max_stack_depth``."""


class MaxStepsExceededError(AutobatchError):
    """Some batch members had not finished after ``max_steps`` steps of the runtime loop."""


class PrimitiveError(AutobatchError):
    """A primitive (the user's straight-line code) raised; the message names its source line."""

"""Errors raised by ``tfx_vec.pfor``.

Every error names the TF op type and the user's source line that created the op (taken from
``op.traceback``: the innermost frame outside TensorFlow, Keras and ``tfx_vec`` itself).

Example:
    >>> err = VectorizationError("no converter", op_type="Foo", source="model.py:12")
    >>> str(err)
    'Foo (created at model.py:12): no converter'
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["PforError", "VectorizationError", "user_source_line", "op_error",
           "runtime_message", "from_runtime_error", "RUNTIME_MARKER"]

#: Marker put into run-time assertion messages so that the eager entry points can turn the
#: resulting ``InvalidArgumentError`` back into a :class:`VectorizationError`.
RUNTIME_MARKER = "tfx_vec.VectorizationError"

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_PARTS = (os.sep + "tensorflow" + os.sep, os.sep + "keras" + os.sep,
                  os.sep + "tf_keras" + os.sep, os.sep + "absl" + os.sep,
                  os.sep + "tensorflow_probability" + os.sep, "<frozen ", os.sep + "contextlib.py",
                  os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep)


class PforError(Exception):
    """Root of every error raised by ``tfx_vec.pfor``.

    Example:
        >>> issubclass(VectorizationError, PforError)
        True
    """


class VectorizationError(PforError, ValueError):
    """An op (or a use of pfor) that cannot be vectorized.

    ``op_type`` and ``source`` ("file:line") say which op and which user line created it.

    Example:
        >>> import tensorflow as tf, tfx_vec
        >>> x = tf.constant([[1, 2], [3, 4]])
        >>> try:
        ...     tfx_vec.pfor(lambda i: tf.tile(tf.gather(x, i), [i + 1]), 2,
        ...                  fallback_to_while_loop=False)
        ... except VectorizationError as e:
        ...     print(e.op_type)
        Tile
    """

    def __init__(self, message: str, *, op_type: str | None = None, source: str | None = None):
        self.op_type, self.source, self.message = op_type, source, message
        prefix = ""
        if op_type:
            prefix = op_type + (f" (created at {source})" if source else "") + ": "
        super().__init__(prefix + message)


def _is_library_frame(filename: str) -> bool:
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    return any(part in path for part in _LIBRARY_PARTS)


def user_source_line(op: Any) -> str | None:
    """The "file:line" of the innermost frame of ``op.traceback`` outside the libraries.

    Example:
        >>> import tensorflow as tf
        >>> op = tf.function(lambda: tf.constant(1.0) + 1.0).get_concrete_function(
        ...     ).graph.get_operations()[-2]
        >>> user_source_line(op).startswith("<doctest")
        True
    """
    try:
        frames = list(op.traceback)
    except Exception:  # an op without a traceback (e.g. imported from a GraphDef)
        return None
    for frame in reversed(frames):
        filename = getattr(frame, "filename", None) or frame[0]
        lineno = getattr(frame, "lineno", None) or frame[1]
        if not _is_library_frame(filename):
            return f"{filename}:{lineno}"
    return None


def op_error(op: Any, message: str) -> VectorizationError:
    """A :class:`VectorizationError` for ``op`` with its type and user source line.

    Example:
        >>> import tensorflow as tf
        >>> g = tf.function(lambda: tf.constant(1.0)).get_concrete_function().graph
        >>> op_error(g.get_operations()[0], "unsupported").op_type
        'Const'
    """
    return VectorizationError(message, op_type=op.type, source=user_source_line(op))


def runtime_message(op: Any, message: str) -> str:
    """Text for a run-time assertion about ``op`` (recognised by :func:`from_runtime_error`).

    Example:
        >>> import tensorflow as tf
        >>> g = tf.function(lambda: tf.constant(1.0)).get_concrete_function().graph
        >>> runtime_message(g.get_operations()[0], "ragged").startswith(RUNTIME_MARKER)
        True
    """
    return f"{RUNTIME_MARKER}: {op_error(op, message)}"


def from_runtime_error(err: BaseException) -> VectorizationError | None:
    """Turn a TF run-time error raised by one of our assertions into a VectorizationError.

    Example:
        >>> str(from_runtime_error(RuntimeError(RUNTIME_MARKER + ": Where: ragged")))
        'Where: ragged'
        >>> from_runtime_error(RuntimeError("something else")) is None
        True
    """
    text = getattr(err, "message", None) or str(err)
    if RUNTIME_MARKER not in text:
        return None
    text = text[text.index(RUNTIME_MARKER) + len(RUNTIME_MARKER) + 2:]
    return VectorizationError(text.split("\n")[0].split("\t")[0].strip())

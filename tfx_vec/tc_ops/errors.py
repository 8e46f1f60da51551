"""The errors of tc_ops: one root, precise subclasses, messages that point into the TC source.

Every error raised on a TC's text carries a :class:`Span`; its message reads
``line L, column C: <what>`` followed by the source line and a caret under the column
(as Lark's ``get_context`` does).  Syntax errors also list the expected tokens.

Example:
    >>> from tfx_vec.tc_ops.errors import TcNameError, Span
    >>> src = "def f(float(N) A) -> (B) {\\nB(i) = C(i)\\n}"
    >>> e = TcNameError("undefined tensor 'C'", Span(2, 8), src)
    >>> print(e)
    line 2, column 8: undefined tensor 'C'
      B(i) = C(i)
             ^
"""
from __future__ import annotations

import dataclasses

__all__ = ["Span", "TcError", "TcSyntaxError", "TcNameError", "TcTypeError", "TcSemanticError",
           "TcRangeError", "TcShapeError", "TcOptionsError", "TcCompileError", "TcBackendError",
           "TcSecurityError", "TcGradientError", "TcWarning"]


@dataclasses.dataclass(frozen=True)
class Span:
    """A 1-based (line, column) position in a TC source, with an optional end column.

    Example:
        >>> str(Span(3, 7)), Span(3, 7, 9).end_column
        ('line 3, column 7', 9)
    """

    line: int
    column: int
    end_column: int | None = None

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}"


def source_context(source: str, span: Span) -> str:
    """The source line of ``span`` and a caret line under its column(s) (tab-aware)."""
    lines = source.split("\n")
    if not 1 <= span.line <= len(lines):
        return ""
    text = lines[span.line - 1]
    col = max(1, min(span.column, len(text) + 1))
    pad = "".join("\t" if ch == "\t" else " " for ch in text[:col - 1])
    width = 1
    if span.end_column is not None and span.end_column > col:
        width = min(span.end_column, len(text) + 1) - col
    return f"  {text}\n  {pad}{'^' * max(1, width)}"


class TcError(Exception):
    """Root of every error tc_ops raises on a user's TC, options or inputs.

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> try:
        ...     tc.define("def f(float(N) A) -> (B) { B(i) = A(i) + }")
        ... except tc.TcError as e:
        ...     print(type(e).__name__, e.line, e.column)
        TcSyntaxError 1 42
    """

    # AutoGraph re-raises an error from converted code as a StagingError unless its class takes a
    # bare message; marked errors (as TF marks its UnliftableError) keep their type, so
    # ``except TcBackendError`` works the same inside ``tf.function``.
    ag_pass_through = True

    def __init__(self, message: str, span: Span | None = None, source: str | None = None):
        self.message, self.span, self.source = message, span, source
        super().__init__(self._format())

    def _format(self) -> str:
        if self.span is None:
            return self.message
        text = f"{self.span}: {self.message}"
        if self.source is not None:
            ctx = source_context(self.source, self.span)
            if ctx:
                text += "\n" + ctx
        return text

    @property
    def line(self) -> int | None:
        return None if self.span is None else self.span.line

    @property
    def column(self) -> int | None:
        return None if self.span is None else self.span.column

    def with_source(self, source: str) -> "TcError":
        """The same error, its message re-rendered with ``source`` (for a caret)."""
        self.source = source
        self.args = (self._format(),)
        return self


class TcSyntaxError(TcError):
    """The text is not a TC: an unexpected character or token (``expected`` lists what fits).

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> tc.define("def f(float(N) A) -> (B) { B(i) = A(i) + }")
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcSyntaxError: line 1, column 42: unexpected '}'
        ...
    """

    def __init__(self, message: str, span: Span | None = None, source: str | None = None,
                 expected: tuple[str, ...] = ()):
        self.expected = tuple(sorted(set(expected)))
        if self.expected:
            message += "\nExpected one of: " + ", ".join(self.expected)
        super().__init__(message, span, source)


class TcNameError(TcError):
    """An undefined name, a duplicate definition, or a tensor read before it is written.

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> tc.define("def f(float(N) A) -> (B) { B(i) = C(i) }")
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcNameError: line 1, column 35: in def f: undefined tensor or ... 'C'
        ...
    """


class TcTypeError(TcError):
    """Arity or type mismatch: wrong number of subscripts or arguments, bad operand types.

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> tc.define("def f(float(N) A) -> (B) { B(i) = A(i, 0) }")
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcTypeError: line 1, column 35: in def f: A has 1 dimension(s) but is accessed ...
        ...
    """


class TcSemanticError(TcError):
    """A well-typed TC that breaks TC's semantics (in-place interference, mixed reductions,
    an index used twice on a left side, ...).

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> tc.define("def f(float(N) A) -> (B) { B(i) +=! A(i)  B(i) *= A(i) }")
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcSemanticError: line 1, column 43: in def f: mixed reduction ... B: ...
        ...
    """


class TcRangeError(TcError):
    """Range inference is ambiguous or impossible, or an access may leave its tensor.

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) where i in 0:N+1 }")
        >>> mod.f(np.ones(4, np.float32))
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcRangeError: line 1, column 37: in def f: subscript i of A ranges over [0, 4] ...
        ...
    """


class TcShapeError(TcError):
    """Inputs at call time do not match the TC's signature (rank, sizes, dtype, count).

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }").f(np.ones((2, 2), np.float32))
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcShapeError: f: input A is declared float(N) (rank 1) but got shape (2, 2) ...
    """


class TcOptionsError(TcError):
    """Invalid MappingOptions.

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> tc.MappingOptions(tile=(0,))
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcOptionsError: MappingOptions.tile: expected positive ints, got (0,)
    """


class TcCompileError(TcError):
    """The generated code failed to compile (the compiler's output is in the message).

    Example:
        >>> isinstance(TcCompileError("cc: error: ..."), TcError)
        True
    """


class TcBackendError(TcError):
    """A backend is unknown or unavailable on this machine.

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }", backend="tpu")
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcBackendError: unknown tc_ops backend 'tpu'; available: ...
    """


class TcGradientError(TcError):
    """The gradient of a TC was asked for and cannot be derived automatically (the message names
    the TC line and column and how to supply a backward TC).

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def prod(float(N,K) A) -> (P) { P(n) *=! A(n,k) }")
        >>> a = tf.ones([2, 3])
        >>> with tf.GradientTape() as tape:
        ...     tape.watch(a)
        ...     p = tf.reduce_sum(mod.prod(a))
        >>> tape.gradient(p, a)
        Traceback (most recent call last):
        ...
        tfx_vec.tc_ops.errors.TcGradientError: line 1, column 33: automatic gradients of *= reductions are ...
        ...
    """


class TcWarning(UserWarning):
    """A TC that is valid but likely not what was meant (e.g. a reduction without ``!`` into a
    tensor no earlier statement initialises), located like a :class:`TcError`.

    Example:
        >>> import warnings
        >>> from tfx_vec import tc_ops as tc
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = tc.define("def f(float(N,K) A) -> (S) { S(n) += A(n,k) }")
        >>> caught[0].category.__name__, str(caught[0].message).split(":")[0]
        ('TcWarning', 'line 1, column 30')
    """

    def __init__(self, message: str, span: Span | None = None, source: str | None = None):
        super().__init__(TcError(message, span, source).args[0])


class TcSecurityError(TcError):
    """Something tc_ops refuses to trust: a cache directory or key file that another user owns
    or can write, a symbolic link where a cache entry or directory should be (see SECURITY.md).

    Example:
        >>> issubclass(TcSecurityError, TcError)
        True
    """

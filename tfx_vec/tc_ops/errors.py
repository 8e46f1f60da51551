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
           "TcSecurityError"]


@dataclasses.dataclass(frozen=True)
class Span:
    """A 1-based (line, column) position in a TC source, with an optional end column."""

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
    """Root of every error tc_ops raises on a user's TC, options or inputs."""

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
    """The text is not a TC: an unexpected character or token (``expected`` lists what fits)."""

    def __init__(self, message: str, span: Span | None = None, source: str | None = None,
                 expected: tuple[str, ...] = ()):
        self.expected = tuple(sorted(set(expected)))
        if self.expected:
            message += "\nExpected one of: " + ", ".join(self.expected)
        super().__init__(message, span, source)


class TcNameError(TcError):
    """An undefined name, a duplicate definition, or a tensor read before it is written."""


class TcTypeError(TcError):
    """Arity or type mismatch: wrong number of subscripts or arguments, bad operand types."""


class TcSemanticError(TcError):
    """A well-typed TC that breaks TC's semantics (in-place interference, mixed reductions,
    an index used twice on a left side, ...)."""


class TcRangeError(TcError):
    """Range inference is ambiguous or impossible, or an access may leave its tensor."""


class TcShapeError(TcError):
    """Inputs at call time do not match the TC's signature (rank, sizes, dtype, count)."""


class TcOptionsError(TcError):
    """Invalid MappingOptions."""


class TcCompileError(TcError):
    """The generated code failed to compile (the compiler's output is in the message)."""


class TcBackendError(TcError):
    """A backend is unknown or unavailable on this machine."""


class TcSecurityError(TcError):
    """Something tc_ops refuses to trust: a cache directory or key file that another user owns
    or can write, a symbolic link where a cache entry or directory should be (see SECURITY.md)."""

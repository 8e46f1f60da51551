"""Tokens of the TC language (hand-written scanner; every token knows its line and column).

Example:
    >>> [t.kind for t in tokenize("O(i) max=! A(i) # c")][:6]
    ['ID', '(', 'ID', ')', 'max=!', 'ID']
"""
from __future__ import annotations

import dataclasses
import re

from ..errors import Span, TcSyntaxError

__all__ = ["Token", "tokenize", "TOKEN_NAMES"]


@dataclasses.dataclass(frozen=True)
class Token:
    """One token: its kind (``"ID"``, a literal kind or the operator itself), its text and
    where it starts (1-based line and column).

    Example:
        >>> tokenize("A(i)")[0]
        Token(kind='ID', text='A', line=1, column=1)
    """
    kind: str      # "ID", "INT", "FLOAT", "EOF", or the punctuation/operator text itself
    text: str
    line: int
    column: int

    @property
    def span(self) -> Span:
        return Span(self.line, self.column, self.column + max(1, len(self.text)))


# Human names for "Expected one of:" lists.
TOKEN_NAMES = {"ID": "identifier", "INT": "integer", "FLOAT": "number", "EOF": "end of input"}

_OPERATORS = sorted(["->", "+=!", "*=!", "+=", "*=", "==", "!=", "<=", ">=", "&&", "||",
                     "(", ")", "{", "}", ",", ":", "?", ".", "+", "-", "*", "/", "%", "<", ">",
                     "!", "=", "\u2192", "<=>", "[", "]"], key=len, reverse=True)
_NUMBER = re.compile(r"(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fF]?|0[xX][0-9a-fA-F]+")
_IDENT = re.compile(r"[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*")


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens; ``#`` starts a comment to the end of the line.

    ``min=``/``max=`` (and their ``!`` forms) are single reduction tokens; ``→`` is ``->``.

    Raises:
        TcSyntaxError: on a character that starts no token.

    Example:
        >>> [t.text for t in tokenize("B(i) +=! A(i, k)  # sum")][:4]
        ['B', '(', 'i', ')']
    """
    if not isinstance(source, str):
        raise TcSyntaxError(f"TC source must be a str, got {type(source).__name__}")
    toks: list[Token] = []
    pos, line, line_start, n = 0, 1, 0, len(source)
    while pos < n:
        ch = source[pos]
        col = pos - line_start + 1
        if ch == "\n":
            pos, line, line_start = pos + 1, line + 1, pos + 1
            continue
        if ch in " \t\r\f\v":
            pos += 1
            continue
        if ch == "#":
            while pos < n and source[pos] != "\n":
                pos += 1
            continue
        m_id = _IDENT.match(source, pos)
        m_num = _NUMBER.match(source, pos)
        # an identifier may start with digits ("2LUT"); a number wins only if it is longer
        if m_id and (not m_num or len(m_id.group()) > len(m_num.group())):
            text = m_id.group()
            end = m_id.end()
            if text in ("min", "max") and source.startswith("=", end) \
                    and not source.startswith("==", end):
                bang = source.startswith("=!", end)
                text += "=!" if bang else "="
                end += 2 if bang else 1
                toks.append(Token(text, text, line, col))
            else:
                toks.append(Token("ID", text, line, col))
            pos = end
            continue
        if m_num and ch == "." and toks and toks[-1].kind == "ID" and \
                toks[-1].line == line and toks[-1].column + len(toks[-1].text) == col:
            m_num = None        # "A.1": the dimension-size operator, not the number .1
        if m_num:
            text = m_num.group()
            is_float = any(c in text for c in ".eEfF") and not text.lower().startswith("0x")
            toks.append(Token("FLOAT" if is_float else "INT", text, line, col))
            pos = m_num.end()
            continue
        for op in _OPERATORS:
            if source.startswith(op, pos):
                kind = "->" if op == "\u2192" else op
                toks.append(Token(kind, op, line, col))
                pos += len(op)
                break
        else:
            raise TcSyntaxError(f"unexpected character {ch!r}", Span(line, col), source)
    toks.append(Token("EOF", "", line, pos - line_start + 1))
    return toks

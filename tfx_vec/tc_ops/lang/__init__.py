"""The TC language: lexer, parser, AST with spans, semantic checks, range inference.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> [d.name for d in parse("def f(float(N) A) -> (B) { B(i) = A(i) }").defs]
    ['f']
"""
from .parser import parse

__all__ = ["parse"]

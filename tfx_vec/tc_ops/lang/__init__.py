"""The TC language: lexer, parser, AST with spans, semantic checks, range inference."""
from .parser import parse

__all__ = ["parse"]

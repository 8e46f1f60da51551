"""Recursive-descent parser for the TC grammar of the paper's Figure 14.

Errors are :class:`~tfx_vec.tc_ops.errors.TcSyntaxError` with the offending token's line and
column, a caret, and the tokens that would have fitted ("Expected one of: ...").

Example:
    >>> prog = parse('''
    ... def tmm(float(M,K) A, float(N,K) B) -> (C) {
    ...     C(m,n) +=! A(m,kk) * B(n,kk)
    ... }''')
    >>> d = prog.defs[0]
    >>> d.name, [p.name for p in d.params], d.stmts[0].op, d.stmts[0].init
    ('tmm', ['A', 'B'], '+=', True)
"""
from __future__ import annotations

from ..errors import Span, TcSyntaxError
from . import ast as A
from .lexer import TOKEN_NAMES, Token, tokenize
from .types import canonical

__all__ = ["parse", "parse_expr"]

_ASSIGN = {"=": ("=", False), "+=": ("+=", False), "*=": ("*=", False), "min=": ("min=", False),
           "max=": ("max=", False), "+=!": ("+=", True), "*=!": ("*=", True),
           "min=!": ("min=", True), "max=!": ("max=", True)}
# binary operators by precedence level, loosest first
_LEVELS = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%")]
_MAX_DEPTH = 48   # deeper expressions would exhaust Python's stack in later passes
_KEYWORDS = ("def", "where")  # "in" is only special inside a where clause


def parse(source: str) -> A.Program:
    """Parse a TC source (one or more ``def``) into a :class:`~.ast.Program`.

    Raises:
        TcSyntaxError: with line, column, caret and the expected tokens.

    Example:
        >>> prog = parse("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
        >>> [p.name for p in prog.defs[0].params]
        ['A', 'B']
    """
    return _Parser(source).program()


def _resolver(lets: dict, rank0, scalars=frozenset()):
    """Rewrites an expression: a bound name becomes (a fresh copy of) its binding, a 0-d
    tensor's bare name becomes its read ``v()``, and a scalar parameter read as ``a()`` (a 0-d
    tensor in the original's terms) becomes ``a``."""
    def fn(x: A.Ident) -> A.Expr:
        if x.name in lets:
            return A.map_idents(lets[x.name], lambda y: A.Ident(y.name, y.span))
        if x.name in rank0:
            return A.Call(x.name, (), x.span)
        return x

    def rewrite(e: A.Expr) -> A.Expr:
        e = A.map_idents(e, fn)
        if not scalars:
            return e
        return A.map_calls(e, lambda c: A.Ident(c.name, c.span)
                           if c.name in scalars and not c.args else c)
    return rewrite


def parse_expr(text: str) -> A.Expr:
    """Parse one TC expression (what the gradient pass splices together as text).

    >>> parse_expr("A(i + 1) * 2").op
    '*'
    """
    p = _Parser(text)
    e = p.expr()
    if not p.at("EOF"):
        raise p.error(("EOF",))
    return e


class _Parser:
    def __init__(self, source: str):
        self.source = source
        self.toks = tokenize(source)
        self.pos = 0
        self.depth = 0

    # -- token helpers -------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def at(self, *kinds: str) -> bool:
        return self.tok.kind in kinds

    def at_word(self, word: str) -> bool:
        return self.tok.kind == "ID" and self.tok.text == word

    def advance(self) -> Token:
        t = self.tok
        self.pos = min(self.pos + 1, len(self.toks) - 1)
        return t

    def error(self, expected: tuple[str, ...], what: str | None = None) -> TcSyntaxError:
        t = self.tok
        found = "end of input" if t.kind == "EOF" else repr(t.text)
        names = tuple(TOKEN_NAMES.get(e, repr(e) if not e.startswith("<") else e[1:-1])
                      for e in expected)
        return TcSyntaxError(what or f"unexpected {found}", t.span, self.source, names)

    def integer(self, t: Token) -> int:
        """The value of the INT token ``t``; a decimal with a leading zero (``02``) is
        refused, as C would read it in octal."""
        try:
            return int(t.text, 0)
        except ValueError:
            raise TcSyntaxError(f"integer {t.text!r} has a leading zero; write it without one "
                                "(integers are decimal)", t.span, self.source) from None

    def expect(self, *kinds: str) -> Token:
        if self.tok.kind in kinds:
            return self.advance()
        raise self.error(kinds)

    def expect_word(self, word: str) -> Token:
        if self.at_word(word):
            return self.advance()
        raise self.error((f"'{word}'",))

    def ident(self, what: str = "identifier") -> Token:
        if self.tok.kind == "ID" and self.tok.text not in _KEYWORDS:
            return self.advance()
        raise self.error((f"<{what}>",))

    # -- grammar -------------------------------------------------------------------------
    def program(self) -> A.Program:
        defs = []
        while not self.at("EOF"):
            if not self.at_word("def"):
                raise self.error(("'def'", "EOF"))
            defs.append(self.func())
        if not defs:
            raise self.error(("'def'",), "empty TC source: expected at least one 'def'")
        return A.Program(tuple(defs), self.source)

    def func(self) -> A.Def:
        start = self.expect_word("def")
        name = self.ident("function name").text
        self.expect("(")
        params = []
        if not self.at(")"):
            params.append(self.param())
            while self.at(","):
                self.advance()
                params.append(self.param())
        self.expect(")")
        self.expect("->")
        self.expect("(")
        rets = [self.output()]
        while self.at(","):
            self.advance()
            rets.append(self.output())
        self.expect(")")
        self.expect("{")
        stmts = []
        scalars = {p.name for p in params if p.is_scalar}
        # 0-d tensors (inputs declared "float() x", outputs written without indices) read as
        # "x" too
        rank0 = {p.name for p in params if p.dims == ()}
        while not self.at("}"):
            if self.at("EOF"):
                raise self.error(("'}'", "<identifier>"))
            s = self.stmt(rank0 - scalars, scalars)
            stmts.append(s)
            if not s.lhs_indices:
                rank0.add(s.lhs)
        self.expect("}")
        if not stmts:
            raise TcSyntaxError(f"def {name} has no statement", start.span, self.source)
        return A.Def(name, tuple(params), tuple(r[0].text for r in rets),
                     tuple(r[0].span for r in rets), tuple(stmts), start.span,
                     tuple(r[1] for r in rets))

    def output(self) -> tuple[Token, A.Param | None]:
        """An output: ``name`` (type and range inferred) or ``type name`` / ``type(D1,..) name``
        (declared element type and sizes, checked against what the statements compute)."""
        if self.tok.kind == "ID" and self.peek().kind in ("ID", "("):
            p = self.param()
            return Token("ID", p.name, p.span.line, p.span.column), p
        return self.ident("output name"), None

    def param(self) -> A.Param:
        t = self.ident("type")
        dtype = canonical(t.text)
        if dtype is None:
            raise TcSyntaxError(f"unknown scalar type {t.text!r}", t.span, self.source,
                                ("bool", "double", "float", "half", "int32", "int64", "..."))
        dims = None
        spans: list[Span] = []
        if self.at("("):
            self.advance()
            dims = []
            if not self.at(")"):
                while True:
                    d = self.expect("ID", "INT")
                    dims.append(self.integer(d) if d.kind == "INT" else d.text)
                    spans.append(d.span)
                    if not self.at(","):
                        break
                    self.advance()
            self.expect(")")
            dims = tuple(dims)
        name = self.ident("parameter name")
        return A.Param(dtype, dims, name.text, name.span, tuple(spans))

    def stmt(self, rank0: set = frozenset(), scalars: set = frozenset()) -> A.Stmt:
        """One statement.  ``rank0`` names the 0-d tensors defined so far, which read as
        ``v`` as well as ``v()``; ``where name = e`` bindings are inlined into the statement."""
        if self.at("("):
            raise self.error(("<identifier>",), "TC function calls '(outs) = f(args)' are not "
                             "supported; inline the callee's statements")
        lhs = self.ident("tensor name")
        idx: list[Token] = []
        if self.at("("):
            self.advance()
            if not self.at(")"):
                idx.append(self.ident("index variable"))
                while self.at(","):
                    self.advance()
                    idx.append(self.ident("index variable"))
            self.expect(")")
        if self.tok.kind not in _ASSIGN:
            raise self.error(tuple(_ASSIGN) + (("(",) if not idx else ()))
        op, init = _ASSIGN[self.advance().kind]
        rhs = self.expr()
        where, exists, lets = [], [], {}
        if self.at_word("where"):
            self.advance()
            self.where_clause(where, exists, lets)
            while self.at(","):
                self.advance()
                self.where_clause(where, exists, lets)
        if self.at("<=>"):       # "<=> lib(args)": an equivalent library call, a hint only
            self.advance()
            self.ident("library function name")
            self.expect("(")
            if not self.at(")"):
                self.expr()
                while self.at(","):
                    self.advance()
                    self.expr()
            self.expect(")")
        resolve = _resolver(lets, rank0, scalars)
        return A.Stmt(lhs.text, tuple(t.text for t in idx), tuple(t.span for t in idx), op, init,
                      resolve(rhs), tuple(where), lhs.span, tuple(resolve(e) for e in exists))

    def where_clause(self, where: list, exists: list, lets: dict) -> None:
        """``i in lo:hi`` (a range), ``exists e`` (accesses of ``e`` bound the ranges, ``e`` is
        not evaluated) or ``name = e`` (a named binding, inlined where ``name`` is used)."""
        if self.at_word("exists") and self.peek().kind not in ("=",) and \
                not (self.peek().kind == "ID" and self.peek().text == "in"):
            self.advance()
            exists.append(_resolver(lets, frozenset())(self.expr()))
            return
        var = self.ident("index variable or binding name")
        if self.at("=") and self.peek().kind == "[":      # "i = [lo, hi[": a range
            self.advance()
            self.advance()
            lo = self.binary(0)
            self.expect(",")
            hi = self.binary(0)
            self.expect("[")
            where.append(A.RangeConstraint(var.text, lo, hi, var.span))
            return
        if self.at("="):
            self.advance()
            if var.text in lets:
                raise TcSyntaxError(f"{var.text!r} is bound twice in this where clause",
                                    var.span, self.source)
            lets[var.text] = _resolver(lets, frozenset())(self.expr())
            return
        if not self.at_word("in"):
            raise self.error(("'in'", "'='"))
        self.advance()
        lo = self.binary(0)
        self.expect(":")
        hi = self.binary(0)
        where.append(A.RangeConstraint(var.text, lo, hi, var.span))

    # -- expressions ---------------------------------------------------------------------
    def expr(self) -> A.Expr:
        self.depth += 1
        try:
            if self.depth > _MAX_DEPTH:
                raise self.error((), f"expression nested more than {_MAX_DEPTH} levels deep")
            return self._expr()
        finally:
            self.depth -= 1

    def _expr(self) -> A.Expr:
        cond = self.binary(0)
        if self.at("?"):
            q = self.advance()
            then = self.expr()
            self.expect(":")
            other = self.expr()
            return A.Ternary(cond, then, other, q.span)
        return cond

    def binary(self, level: int) -> A.Expr:
        if level == len(_LEVELS):
            return self.unary()
        lhs = self.binary(level + 1)
        while self.tok.kind in _LEVELS[level]:
            op = self.advance()
            rhs = self.binary(level + 1)
            lhs = A.Binary(op.kind, lhs, rhs, op.span)
        return lhs

    def unary(self) -> A.Expr:
        if self.at("-", "!", "+"):
            op = self.advance()
            self.depth += 1
            try:
                if self.depth > _MAX_DEPTH:
                    raise self.error((), f"expression nested more than {_MAX_DEPTH} levels deep")
                return A.Unary(op.kind, self.unary(), op.span)
            finally:
                self.depth -= 1
        return self.primary()

    def primary(self) -> A.Expr:
        t = self.tok
        if t.kind == "INT":
            self.advance()
            return A.IntLit(self.integer(t), t.span)
        if t.kind == "FLOAT":
            self.advance()
            return A.FloatLit(float(t.text.rstrip("fF")), t.text, t.span)
        if t.kind == "(":
            self.advance()
            e = self.expr()
            self.expect(")")
            return e
        if t.kind == "ID" and t.text not in _KEYWORDS:
            self.advance()
            if self.at("("):
                self.advance()
                args = []
                if not self.at(")"):
                    args.append(self.expr())
                    while self.at(","):
                        self.advance()
                        args.append(self.expr())
                self.expect(")")
                return A.Call(t.text, tuple(args), t.span)
            if self.at(".") and self.peek().kind == "INT":
                self.advance()
                k = self.advance()
                return A.DimRef(t.text, self.integer(k), t.span)
            return A.Ident(t.text, t.span)
        raise self.error(("<identifier>", "INT", "FLOAT", "(", "-", "!"))

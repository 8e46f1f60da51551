"""Lexer, parser and semantic checks: every corpus TC parses and checks; every error names its
line and column with a caret; under hypothesis only TcError escapes (random text, mutations)."""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.lang import ast as A
from tfx_vec.tc_ops.lang.lexer import tokenize
from tfx_vec.tc_ops.lang.parser import parse
from tfx_vec.tc_ops.lang.printer import expr_to_tc
from tfx_vec.tc_ops.lang.sema import check

from .corpus import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_parses_and_checks(case):
    prog = parse(case.source)
    d = prog.get(case.entry)
    assert d is not None
    cdef = check(d, case.source)
    assert set(cdef.outputs) <= set(cdef.tensors)


def test_ast_spans_and_forms():
    src = ("def f(float(N,M) A, int32 s) -> (B, C) {\n"
           "  B(i) +=! A(i, j) * (s > 2 ? -1.5f : A.1)   # comment\n"
           "  C(i) max= B(i) where i in 0:N\n"
           "}\n"
           "def g(double(K) x) -> (y) { y(k) = exp(x(k)) }")
    prog = parse(src)
    f, g = prog.defs
    assert (f.name, g.name) == ("f", "g")
    s0, s1 = f.stmts
    assert (s0.op, s0.init, s1.op, s1.init) == ("+=", True, "max=", False)
    assert s0.span == tc.Span(2, 3, 4) and s0.lhs_index_spans[0].column == 5
    assert expr_to_tc(s0.rhs) == "A(i, j) * (s > 2 ? -1.5f : A.1)"
    assert s1.where[0].var == "i" and expr_to_tc(s1.where[0].hi) == "N"
    assert f.params[1].is_scalar and f.params[0].dims == ("N", "M")
    # every node keeps a span
    for e in A.walk(s0.rhs):
        assert e.span.line == 2 and e.span.column >= 1


def test_lexer_reduction_tokens_and_arrow():
    kinds = [t.kind for t in tokenize("a min=! b max= c min(d) x \u2192 +=! *=")]
    assert kinds == ["ID", "min=!", "ID", "max=", "ID", "ID", "(", "ID", ")", "ID", "->",
                     "+=!", "*=", "EOF"]


def _err(src, cls=tc.TcError):
    with pytest.raises(cls) as ei:
        cdef_or_prog = parse(src)
        for d in cdef_or_prog.defs:
            check(d, src)
    return ei.value


SYNTAX_ERRORS = [
    ("def f(float(N) A) -> (B) { B(i) = A(i) + }", 1, 42, ["identifier", "'('"]),
    ("def f(float(N) A) -> (B) { B(i) == A(i) }", 1, 33, ["'+=!'", "'='"]),
    ("def f(flot(N) A) -> (B) { B(i) = A(i) }", 1, 7, ["float"]),
    ("def f(float(N) A) -> B { }", 1, 22, ["'('"]),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) @ 2\n}", 2, 15, []),
    ("def f(float(N) A) -> (B) { B(i) = A(i)", 1, 39, ["'}'"]),
    ("", 1, 1, ["'def'"]),
    ("def f(float(N) A) -> (B) { (B) = g(A) }", 1, 28, []),
    # an integer with a leading zero (octal to C) wherever an integer goes
    ("def f(float(N) A) -> (B) { B(i) = A(i) * 02 }", 1, 42, ["leading zero"]),
    ("def f(float(03) A) -> (B) { B(i) = A(i) }", 1, 13, ["leading zero"]),
    ("def f(float(N) A) -> (B) { B(i) = A(i) where i in 0:A.01 }", 1, 55, ["leading zero"]),
]


@pytest.mark.parametrize("src,line,col,expected", SYNTAX_ERRORS)
def test_syntax_errors_point_at_the_token(src, line, col, expected):
    e = _err(src, tc.TcSyntaxError)
    assert (e.line, e.column) == (line, col)
    msg = str(e)
    assert msg.startswith(f"line {line}, column {col}: ")
    if src:
        caret_line = msg.splitlines()[-1]
        assert caret_line.index("^") == col + 1   # two-space indent, 1-based column
    for x in expected:
        assert x in msg


SEMANTIC_ERRORS = [
    ("def f(float(N) A) -> (B) { B(i) = C(i) }", tc.TcNameError, (1, 35),
     "undefined tensor or function 'C'"),
    ("def f(float(N) A) -> (B) { B(i) = A(i, i) }", tc.TcTypeError, (1, 35),
     "A has 1 dimension(s) but is accessed with 2 subscript(s)"),
    ("def f(float(N) A) -> (B) { B(i) = fmaxf(A(i)) }", tc.TcTypeError, (1, 35),
     "fmaxf takes 2 argument(s), got 1"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) % 2 }", tc.TcTypeError, (1, 40),
     "'%' needs integer operands"),
    ("def f(float(N) A) -> (B) { B(i) = A(A(i)) }", tc.TcTypeError, (1, 37),
     "subscript of A has type float"),
    ("def f(float(N) A) -> (B) { B(i, i) = A(i) }", tc.TcSemanticError, (1, 33),
     "index 'i' is used twice on the left side of B"),
    ("def f(float(N,N) A) -> (B) {\n  B(i,j) = A(i,j)\n  B(i,j) = B(j,i)\n}",
     tc.TcSemanticError, (3, 12), "in-place update of B(i, j) reads B at other indices"),
    ("def f(float(N,M) A) -> (B) {\n  B(i) +=! A(i,j)\n  B(i) max= A(i,j)\n}",
     tc.TcSemanticError, (3, 3), "mixed reduction operators on B: max= after +=!"),
    ("def f(float(N,M) A) -> (B) { B(i) = A(i,j) }", tc.TcSemanticError, (1, 41),
     "index 'j' appears only on the right of '='"),
    ("def f(float(N) A) -> (B) { B(i) = B(i) + A(i) }", tc.TcNameError, (1, 35),
     "B is read before it is defined"),
    ("def f(float(N) A) -> (B, C) { B(i) = A(i) }", tc.TcNameError, (1, 26),
     "output 'C' is never written"),
    ("def f(float(N) A) -> (B) { A(i) = 1 }", tc.TcSemanticError, (1, 28),
     "cannot write to input 'A'"),
    ("def f(float(N) A, float(N) A) -> (B) { B(i) = A(i) }", tc.TcNameError, (1, 28),
     "parameter 'A' is declared twice"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) where j in 0:2 }", tc.TcNameError, (1, 46),
     "where-clause constrains 'j'"),
    ("def f(float(N) A) -> (B) { B(i) +=! A(i + j) }", tc.TcRangeError, (1, 30),
     "cannot infer the range of index 'i': it only occurs together with other unresolved"),
    ("def f(float(N) A) -> (B) { B(i) = 1 }", tc.TcRangeError, (1, 30),
     "cannot infer the range of index 'i': it does not index any tensor"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) }\ndef f(float(N) A) -> (B) { B(i) = A(i) }",
     tc.TcNameError, (2, 1), "def f is defined twice"),
]


@pytest.mark.parametrize("src,cls,pos,text", SEMANTIC_ERRORS, ids=[x[3][:30] for x in
                                                                    SEMANTIC_ERRORS])
def test_semantic_errors(src, cls, pos, text):
    with pytest.raises(cls) as ei:
        tc.define(src)
    e = ei.value
    assert (e.line, e.column) == pos, str(e)
    assert text in str(e)
    lines = str(e).splitlines()
    assert lines[0].startswith(f"line {pos[0]}, column {pos[1]}: ")
    assert "^" in lines[-1] and lines[-2].strip() in src


def test_in_place_pointwise_and_transpose_to_new_tensor_are_allowed():
    tc.define("def f(float(N,N) A) -> (B, C) {\n B(i,j) = A(j,i)\n B(i,j) = B(i,j) * 2\n"
              " C(i,j) = B(j,i)\n}")


# -- hypothesis: only TcError may escape ------------------------------------------------
_ALPHABET = st.sampled_from(list("abcABC019_ (){},:?.+-*/%<>=!#\n\t") +
                            ["def", "where", "in", "float", "int32", "->", "+=!", "max=",
                             "min=!", "*=", "exp", " f(", "A(i)", "1.5f", "\u2192", "@", "\\"])


def _only_tc_errors(src):
    try:
        tc.define(src)
    except tc.TcError:
        pass


@settings(max_examples=150)
@given(st.lists(_ALPHABET, max_size=40).map("".join))
def test_random_text_raises_only_tc_errors(src):
    _only_tc_errors(src)


@settings(max_examples=150)
@given(st.sampled_from(CASES), st.data())
def test_mutated_programs_raise_only_tc_errors(case, data):
    src = case.source
    toks = re.findall(r"\w+|\S|\s+", src)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(toks) - 1))
        op = data.draw(st.sampled_from(["del", "dup", "swap", "replace"]))
        if op == "del":
            toks.pop(i)
        elif op == "dup":
            toks.insert(i, toks[i])
        elif op == "swap" and i + 1 < len(toks):
            toks[i], toks[i + 1] = toks[i + 1], toks[i]
        else:
            toks[i] = data.draw(st.sampled_from(["(", ")", ",", "i", "A", "+=", "=", "0", "-1",
                                                 "where", "x", "float", "#", "N", "?", ":"]))
        if not toks:
            toks = [""]
    _only_tc_errors("".join(toks))


@pytest.mark.parametrize("src", ["(" * 3000 + "1" + ")" * 3000, "-" * 3000 + "1",
                                 "A(" * 2000 + "i" + ")" * 2000])
def test_deep_nesting_is_a_syntax_error(src):
    with pytest.raises(tc.TcSyntaxError, match="nested more than"):
        tc.define("def f(float(N) A) -> (B) { B(i) = " + src + " }")


def test_a_reduction_without_initialisation_warns_where_it_is():
    """As the original does, a reduction without ``!`` into a tensor nothing initialised is
    accepted with a located warning: it reduces into the caller's ``outputs=`` (else zeros)."""
    with pytest.warns(tc.TcWarning, match=r"line 1, column 28: in def f: B is reduced with \+= "
                                          r"without being initialised"):
        tc.define("def f(float(N) A) -> (B) { B(i) += A(i) }")

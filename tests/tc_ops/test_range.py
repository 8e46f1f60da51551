"""Range inference (§3.1): rounds, maximal ranges, intersection, where clauses, deferred
statements, call-time size checks -- against hand-derived formulas on random sizes."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.lang.parser import parse
from tfx_vec.tc_ops.lang.ranges import infer_ranges
from tfx_vec.tc_ops.lang.sema import check

from .corpus import BY_NAME


def _def(src, name=None):
    prog = parse(src)
    d = prog.defs[0] if name is None else prog.get(name)
    return check(d, src)


def test_conv1d_rounds_follow_the_paper():
    d = _def(BY_NAME["conv1d"].source)
    (rounds,) = [cs.rounds for cs in d.stmts]
    assert [[v for v, _ in r] for r in rounds] == [["x"], ["i"]]   # K(x) first, then I(i + x)
    r = infer_ranges(d, {"I": (10,), "K": (3,)})
    assert r.stmt_ranges[0] == {"i": (0, 8), "x": (0, 3)} and r.shapes["O"] == (8,)


@given(st.integers(1, 40), st.integers(1, 40))
def test_conv1d_range_is_m_minus_n_plus_one(m, n):
    d = _def(BY_NAME["conv1d"].source)
    if n > m:
        with pytest.raises(tc.TcRangeError, match="empty range"):
            infer_ranges(d, {"I": (m,), "K": (n,)})
    else:
        assert infer_ranges(d, {"I": (m,), "K": (n,)}).shapes["O"] == (m - n + 1,)


@given(st.integers(2, 30), st.integers(2, 30), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 5), st.integers(1, 5))
def test_strided_conv_and_maxpool_sizes(h, w, kh, kw, sh, sw):
    d = _def(BY_NAME["sconv2d"].source)
    shapes = {"I": (1, 2, h, w), "W": (3, 2, kh, kw), "B": (3,)}
    if kh > h or kw > w:
        with pytest.raises(tc.TcRangeError):
            infer_ranges(d, shapes, {"sh": sh, "sw": sw})
        return
    r = infer_ranges(d, shapes, {"sh": sh, "sw": sw})
    assert r.shapes["O"] == (1, 3, (h - kh) // sh + 1, (w - kw) // sw + 1)
    mp = _def(BY_NAME["maxpool2x2"].source)
    assert infer_ranges(mp, {"in": (1, 1, h, w)}).shapes["out"] == (1, 1, (h - 2) // 2 + 1,
                                                                     (w - 2) // 2 + 1)


def test_intersection_of_several_accesses():
    d = _def("def f(float(N) A, float(M) B) -> (C) { C(i) = A(i) + B(i) }")
    assert infer_ranges(d, {"A": (5,), "B": (3,)}).shapes["C"] == (3,)
    d = _def("def f(float(N) A, float(M) B) -> (C) { C(i) = A(i) + B(i + 2) }")
    assert infer_ranges(d, {"A": (4,), "B": (4,)}).shapes["C"] == (2,)


def test_sgemm_k_is_shared_and_sizes_must_agree():
    d = _def(BY_NAME["sgemm"].source)
    r = infer_ranges(d, {"A": (3, 4), "B": (4, 5), "C": (3, 5)})
    assert r.stmt_ranges[1] == {"i": (0, 3), "j": (0, 5), "k": (0, 4)}
    with pytest.raises(tc.TcShapeError, match="size K is 5 from B"):
        infer_ranges(d, {"A": (3, 4), "B": (4, 5), "C": (3, 6)})


def test_statement_deferred_until_its_tensor_is_sized():
    """fcrelu's ``O(b,n) = bias(n)`` cannot bound b; the next statement sizes O."""
    d = _def(BY_NAME["fcrelu"].source)
    assert d.plan_order == (1, 2, 0)
    r = infer_ranges(d, {"I": (4, 3), "W": (5, 3), "bias": (5,)})
    assert r.stmt_ranges[0] == {"b": (0, 4), "n": (0, 5)} and r.shapes["O"] == (4, 5)


def test_where_clause_with_size_expressions_and_scalars():
    d = _def(BY_NAME["kronecker"].source)
    r = infer_ranges(d, {"A": (2, 3), "B": (4, 5)})
    assert r.shapes["C"] == (8, 15)
    d = _def("def f(float(N) A, int32 k) -> (B) { B(i) +=! A(i + j) where j in 0:k }")
    assert d.structural_scalars == ("k",)
    assert infer_ranges(d, {"A": (10,)}, {"k": 3}).shapes["B"] == (8,)
    with pytest.raises(tc.TcShapeError, match="value of scalar 'k' is needed"):
        infer_ranges(d, {"A": (10,)})


def test_negative_coefficient_reverses():
    mod = tc.define("def rev(float(N) A) -> (B) { B(i) = A(N - 1 - i) }")
    a = np.arange(1, 8, dtype=np.float32)
    np.testing.assert_allclose(mod.rev(a).numpy(), a[::-1])


def test_where_range_outside_the_tensor_is_an_error():
    mod = tc.define("def f(float(N) A) -> (B) { B(i) +=! A(i + j) where j in 0:3 }")
    mod.f(np.ones(5, np.float32))
    mod2 = tc.define("def f(float(N) A) -> (B) {\n B(i) +=! A(i) * A(j) where j in 0:N+1\n}")
    with pytest.raises(tc.TcRangeError, match=r"subscript j of A ranges over \[0, 5\]") as ei:
        mod2.f(np.ones(5, np.float32))
    assert (ei.value.line, ei.value.column) == (2, 20)


def test_data_dependent_index_out_of_range_is_caught_at_call_time():
    mod = tc.define(BY_NAME["1LUT"].source)
    lut = np.ones((4, 2), np.float32)
    mod["1LUT"](lut, np.array([[0, 3]], np.int32))
    with pytest.raises(tc.TcRangeError, match=r"ranges over \[-1, 3\]"):
        mod["1LUT"](lut, np.array([[-1, 3]], np.int32))


def test_intermediate_index_tensor_is_clamped_not_out_of_bounds():
    """Values of a computed index tensor are unknown before the run: subscripts are clamped."""
    src = ("def g(float(N) X, int32(A) I) -> (Z, J) {\n  J(i) = I(i) * 2\n"
           "  Z(i) = X(J(i))\n}")
    mod = tc.define(src)
    z, j = mod.g(np.arange(1, 5, dtype=np.float32), np.array([0, 1, 3], np.int32))
    np.testing.assert_allclose(z.numpy(), [1, 3, 4])     # J = [0, 2, 6] -> clamped to 3
    assert "tc_clamp(" in mod.g.source()

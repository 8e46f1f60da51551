"""The CPU contraction micro-kernel (``codegen/contraction.py``): tmm, matmul, fcrelu, MLP3, tbmm,
sgemm and convolutions take the register-blocked form (packed or direct column operand, the
epilogue in registers) and match NumPy on every element: partial row and column tiles, several
reduction blocks, double, scalar factors, random register/cache tiles and vector widths; what
cannot be vectorised keeps the scalar form; the kernels are clean under AddressSanitizer."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.backends import cpu
from tfx_vec.tc_ops.poly.contraction import classify

from .corpus import BY_NAME, _conv_ref
from .test_cpu import _run_under_asan

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
TMM64 = "def tmm(double(M,K) A, double(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
FCRELU = """def fcrelu(float(B,M) I, float(N,M) W, float(N) bias) -> (O) {
    O(b,n) = bias(n)
    O(b,n) += I(b,m) * W(n,m)
    O(b,n) = fmaxf(O(b,n), 0)
}"""
SGEMM = """def sgemm(float a, float b, float(N,M) A, float(M,K) B, float(N,K) C) -> (D) {
    D(i,j) = b * C(i,j)
    D(i,j) += a * A(i,k) * B(k,j)
}"""
CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt, float(F) B) -> (O) {
    O(n,f,h,w) +=! I(n,c,h + kh,w + kw) * Wt(f,c,kh,kw)
    O(n,f,h,w) = fmaxf(O(n,f,h,w) + B(f), 0)
}"""
ACC_CONV = """def acc_conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) += I(n,c,h + kh,w + kw) * Wt(f,c,kh,kw)
}"""


def _conv(I, W, B):
    return np.maximum(_conv_ref(I, W) + B[None, :, None, None], 0)


CASES = [
    # name, source, entry, input shapes, options, reference, kind in the comment
    ("tmm-partial-rows-and-columns", TMM, "tmm", [(37, 70), (45, 70)], None,
     lambda a, b: a @ b.T, "packed"),
    ("tmm-several-reduction-blocks", TMM, "tmm", [(30, 300), (50, 300)],
     tc.MappingOptions(cache_tile=(32, 64)), lambda a, b: a @ b.T, "packed"),
    ("tmm-double", TMM64, "tmm", [(20, 33), (40, 33)], None, lambda a, b: a @ b.T, "packed"),
    ("mm-row-major-b", MM, "mm", [(17, 40), (40, 50)], None, lambda a, b: a @ b, "packed"),
    ("fcrelu-bias-and-relu-in-registers", FCRELU, "fcrelu", [(21, 50), (48, 50), (48,)], None,
     lambda i, w, b: np.maximum(i @ w.T + b, 0), "epilogue in registers"),
    ("conv-direct-overlapping-tail", CONV, "conv", [(2, 3, 9, 21), (5, 3, 3, 3), (5,)], None,
     _conv, "direct column loads"),
]


def _run(source, entry, shapes, options, dtype, seed=3):
    rng = np.random.default_rng(seed)
    args = [random_array(rng, s, dtype) for s in shapes]
    e = tc.define(source)[entry]
    out = e.run_numpy(*args, options=options)[0]
    return args, out, e.source()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_micro_kernels_match_numpy(case):
    _, source, entry, shapes, options, ref, kind = case
    dtype = np.float64 if "double" in source else np.float32
    args, out, src = _run(source, entry, shapes, options, dtype)
    assert "register-blocked contraction micro-kernel" in src and kind in src
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(out, ref(*args), rtol=tol, atol=tol)
    off = (options or tc.MappingOptions.default_for()).replace(block=False)
    _, plain, plain_src = _run(source, entry, shapes, off, dtype)
    assert "micro-kernel" not in plain_src
    np.testing.assert_allclose(out, plain, rtol=tol, atol=tol)


def test_scalars_and_an_initialising_statement_around_the_contraction():
    rng = np.random.default_rng(4)
    A, B, C = (random_array(rng, s) for s in ((24, 20), (20, 35), (24, 35)))
    e = tc.define(SGEMM).sgemm
    out = e(np.float32(1.5), np.float32(-0.5), A, B, C).numpy()
    assert "micro-kernel" in e.source()
    np.testing.assert_allclose(out, -0.5 * C + 1.5 * A @ B, rtol=1e-4, atol=1e-4)


def test_a_reduction_into_the_outputs_contents_never_overlaps_tiles():
    """Without a statement that rewrites the tile, recomputing overlapping columns would add
    twice: the partial column tile runs as scalar code."""
    rng = np.random.default_rng(5)
    I, W = random_array(rng, (1, 2, 5, 21)), random_array(rng, (3, 2, 3, 3))
    O = random_array(rng, (1, 3, 3, 19))
    before = O.copy()
    e = tc.define(ACC_CONV).acc_conv
    e(I, W, outputs=[O])
    assert "direct column loads" in e.source()
    np.testing.assert_allclose(O, before + _conv_ref(I, W), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["MLP3", "tbmm", "group_convolution", "outerProductMM"])
def test_corpus_contractions_take_the_micro_kernel(name):
    case = BY_NAME[name]
    e = tc.define(case.source)[case.entry]
    rng = np.random.default_rng(8)
    args = case.inputs(rng)
    outs = e.run_numpy(*args)
    for o, r in zip(outs, case.reference(*args)):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)


def test_what_is_not_a_contraction_keeps_the_scalar_form():
    from tfx_vec.tc_ops.lang.sema import check_program
    lut = check_program(BY_NAME["1LUT"].source)["1LUT"]
    assert classify(lut, lut.stmts[0], "i", "j") is None      # LUT(I(i,k), j): moves with both
    src = "def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * exp(B(n,kk)) * A(m,kk) }"
    d = check_program(src)["f"]
    split = classify(d, d.stmts[0], "m", "n")
    assert split is not None and split.packable and not split.direct   # exp() is packed as values
    rng = np.random.default_rng(6)
    A, B = random_array(rng, (16, 12)), random_array(rng, (20, 12))
    e = tc.define(src).f
    np.testing.assert_allclose(e(A, B).numpy(), (A * A) @ np.exp(B).T, rtol=1e-4, atol=1e-4)
    assert "micro-kernel" in e.source()
    mix = "def g(float(M,N) A, float(N,M) B) -> (C) { C(m,n) +=! A(m,n) * B(n,m) * k }"
    assert "micro-kernel" not in cpu.generate(
        mix.replace(" * k", ""), "g", [((8, 8), np.float32), ((8, 8), np.float32)])[0]


def test_vector_max_keeps_fmaxf_nan_semantics():
    """The register epilogue's max picks the other operand when one is NaN, as fmaxf does."""
    src = """def r(float(M,K) A, float(N,K) B, float(N) t) -> (C) {
        C(m,n) +=! A(m,kk) * B(n,kk)
        C(m,n) = fmaxf(C(m,n), t(n))
    }"""
    A, B = np.ones((4, 3), np.float32), np.ones((32, 3), np.float32)
    A[1] = np.nan
    t = np.full(32, 5.0, np.float32)
    t[3] = np.nan
    e = tc.define(src).r
    out = e(A, B, t).numpy()
    assert "epilogue in registers" in e.source()
    assert out[0, 0] == 5 and out[1, 0] == 5 and out[0, 3] == 3 and np.isnan(out[1, 3])


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 40),
       rows=st.integers(1, 12), vectors=st.integers(1, 3),
       blocks=st.tuples(st.sampled_from([16, 32, 64, 256]), st.sampled_from([8, 16, 256])),
       width=st.sampled_from([0, 16, 32, 64]), seed=st.integers(0, 2 ** 16))
def test_random_sizes_and_kernel_shapes_match_numpy(m, n, k, rows, vectors, blocks, width, seed):
    rng = np.random.default_rng(seed)
    A, B = random_array(rng, (m, k)), random_array(rng, (n, k))
    o = tc.MappingOptions(register_tile=(rows, vectors), cache_tile=blocks, vector_width=width)
    out = tc.define(FCRELU).fcrelu(A, B, np.zeros(n, np.float32), options=o).numpy()
    np.testing.assert_allclose(out, np.maximum(A @ B.T, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("source,entry,shapes", [
    (TMM, "tmm", [(37, 70), (45, 70)]),
    (FCRELU, "fcrelu", [(21, 50), (45, 50), (45,)]),
    (CONV, "conv", [(1, 2, 6, 23), (3, 2, 3, 3), (3,)])], ids=["tmm", "fcrelu", "conv"])
def test_micro_kernels_under_address_sanitizer(tmp_path, source, entry, shapes):
    """Partial panels, the vector prologue/epilogue (bias loads only on whole tiles) and the
    overlapping last column tile stay inside every buffer."""
    rng = np.random.default_rng(7)
    args = [random_array(rng, s) for s in shapes]
    e = tc.define(source)[entry]
    outs = e.run_numpy(*args)
    assert "micro-kernel" in e.source()
    proc = _run_under_asan(tmp_path, e.source(), "tc_" + entry,
                           args + [np.zeros_like(o) for o in outs])
    assert proc.returncode == 0 and "asan-ok" in proc.stdout, proc.stderr[-3000:]

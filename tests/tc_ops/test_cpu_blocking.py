"""The CPU printer's register-blocked contraction kernel (``CPrinter.emit_blocked``): two parallel
point loops around an innermost ``+=`` reduction become vector accumulators over a packed operand
tile.  Every case checks that the kernel really took that form and matches NumPy on every element
(partial tiles in the row and reduction loops, pre/post statements, double, scalar arithmetic);
expressions that cannot be vectorised keep the scalar form; the blocked kernel is clean under
AddressSanitizer; and tile loops are reordered so the packed tile is reused
(``reuse_tile_order``)."""
import islpy as isl
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.backends import cpu
from tfx_vec.tc_ops.lang import parse
from tfx_vec.tc_ops.lang.ranges import infer_ranges
from tfx_vec.tc_ops.lang.sema import check
from tfx_vec.tc_ops.poly.kernel import build_kernel, reuse_tile_order

from .test_cpu import _run_under_asan

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
TMM64 = "def tmm(double(M,K) A, double(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
FCRELU = """def fcrelu(float(B,M) I, float(N,M) W, float(N) bias) -> (O) {
    O(b,n) = bias(n)
    O(b,n) += I(b,m) * W(n,m)
    O(b,n) = fmaxf(O(b,n), 0)
}"""
ARITH = """def arith(float(M,K) A, float(N,K) B, float s) -> (C) {
    C(m,n) +=! (A(m,kk) - s) * (2 * B(n,kk) + B(n,kk) / 4) - A(m,kk)
}"""


def _tiles(*t):
    return tc.MappingOptions(tile=t)


CASES = [
    # name, source, entry, input shapes, options, reference
    ("tmm-partial-m-and-k", TMM, "tmm", [(37, 70), (96, 70)], _tiles(32, 32, 32),
     lambda a, b: a @ b.T),
    ("tmm-default-options", TMM, "tmm", [(64, 300), (128, 300)], None, lambda a, b: a @ b.T),
    ("tmm-untiled-reduction", TMM, "tmm", [(19, 45), (16, 45)], _tiles(8, 8), lambda a, b: a @ b.T),
    ("tmm-partial-n", TMM, "tmm", [(40, 50), (45, 50)], _tiles(32, 32, 32), lambda a, b: a @ b.T),
    ("tmm-double", TMM64, "tmm", [(20, 33), (64, 33)], _tiles(16, 32, 16), lambda a, b: a @ b.T),
    ("fcrelu-pre-and-post", FCRELU, "fcrelu", [(21, 50), (32, 50), (32,)], _tiles(16, 16),
     lambda i, w, b: np.maximum(i @ w.T + b, 0)),
]


def _run(source, entry, shapes, options, dtype):
    rng = np.random.default_rng(3)
    args = [random_array(rng, s, dtype) for s in shapes]
    e = tc.define(source)[entry]
    out = e(*args, options=options)
    return args, np.asarray(out), e.source()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_blocked_kernels_match_numpy(case):
    _, source, entry, shapes, options, ref = case
    dtype = np.float64 if "double" in source else np.float32
    args, out, src = _run(source, entry, shapes, options, dtype)
    assert "register-blocked" in src and "tc_pk0[" in src
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(out, ref(*args), rtol=tol, atol=tol)
    # the same TC without the micro-kernel gives the same values
    off = (options or tc.MappingOptions.default_for()).replace(block=False)
    _, plain, plain_src = _run(source, entry, shapes, off, dtype)
    assert "register-blocked" not in plain_src
    np.testing.assert_allclose(out, plain, rtol=tol, atol=tol)


def test_scalar_arithmetic_around_the_packed_operand():
    rng = np.random.default_rng(4)
    A, B = random_array(rng, (24, 20), np.float32), random_array(rng, (32, 20), np.float32)
    e = tc.define(ARITH).arith
    out = e(A, B, np.float32(0.5), options=_tiles(8, 32, 8)).numpy()
    assert "register-blocked" in e.source()
    ref = np.einsum("mk,nk->mn", A - 0.5, 2 * B + B / 4) - A.sum(1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("body", ["A(m,kk) * exp(B(n,kk))",          # builtin moving with n
                                  "A(m,kk) * B(n,kk) * A(m,kk)" ])     # fine: A is a broadcast
def test_only_vectorisable_expressions_are_blocked(body):
    src = f"def f(float(M,K) A, float(N,K) B) -> (C) {{ C(m,n) +=! {body} }}"
    rng = np.random.default_rng(6)
    A, B = random_array(rng, (16, 12), np.float32), random_array(rng, (16, 12), np.float32)
    e = tc.define(src).f
    out = e(A, B, options=_tiles(8, 8, 8)).numpy()
    blocked = "exp" not in body
    assert ("register-blocked" in e.source()) == blocked
    ref = A @ np.exp(B).T if not blocked else (A * A) @ B.T
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_extents_that_are_not_whole_vectors_keep_the_scalar_form():
    src, _ = cpu.generate(TMM, "tmm", [((8, 8), np.float32), ((24, 8), np.float32)],
                          _tiles(8, 6, 8))        # n tiles of 6 floats: not 16/32/64 bytes
    assert "register-blocked" not in src


def test_blocked_kernel_under_address_sanitizer(tmp_path):
    rng = np.random.default_rng(7)
    A, B = random_array(rng, (37, 70), np.float32), random_array(rng, (45, 70), np.float32)
    src, _ = cpu.generate(TMM, "tmm", [(A.shape, np.float32), (B.shape, np.float32)],
                          _tiles(32, 32, 32))
    assert "register-blocked" in src
    C = np.zeros((37, 45), np.float32)      # partial tiles in m, n and kk
    proc = _run_under_asan(tmp_path, src, "tc_tmm", [A, B, C])
    assert proc.returncode == 0 and "asan-ok" in proc.stdout, proc.stderr[-3000:]


def _tiled_band(source, shapes, tile):
    d = check(parse(source).defs[0])
    k = build_kernel(d, infer_ranges(d, shapes))
    node = k.isl_schedule(tc.MappingOptions()).get_root().child(0)
    mv = isl.MultiVal.zero(node.band_get_space())
    for i, t in enumerate(tile):
        mv = mv.set_val(i, isl.Val.int_from_si(k.ctx, t))
    return k, node.band_tile(mv)


def _order(node):
    ps = node.band_get_partial_schedule()
    return [ps.get_at(i).to_str() for i in range(node.band_n_member())]


def test_tile_loops_are_put_in_reuse_order():
    """tmm's B(n, kk) does not move with m: the m tile loop goes innermost, so one packed B tile
    serves every m tile, and n's tile loop (32 iterations here, not m's 4) runs on threads."""
    k, band = _tiled_band(TMM, {"A": (128, 64), "B": (64, 64)}, (32, 32, 32))
    before = _order(band)
    after = reuse_tile_order(band, k)
    assert _order(after) == [before[1], before[2], before[0]]
    assert [after.band_member_get_coincident(i) for i in range(3)] == [True, False, True]
    assert after.band_get_permutable()
    src, _ = cpu.generate(TMM, "tmm", [((128, 64), np.float32), ((1024, 64), np.float32)])
    omp = src.index("#pragma omp parallel for")
    assert "_c0 <= 1023; _c0 += 32" in src[omp:omp + 120]     # the n tiles
    # every read moves with m: nothing to reuse, the order stays
    k, band = _tiled_band("def f(float(M,N,K) A) -> (C) { C(m,n) +=! A(m,n,kk) * A(m,n,kk) }",
                          {"A": (8, 8, 8)}, (4, 4, 4))
    assert _order(reuse_tile_order(band, k)) == _order(band)


@settings(max_examples=12)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40),
       tile=st.tuples(*[st.sampled_from([4, 8, 16, 32])] * 3), seed=st.integers(0, 2 ** 16))
def test_random_sizes_and_tiles_match_numpy(m, n, k, tile, seed):
    """Partial tiles anywhere, including i2's (the vectors run over the whole tile extent)."""
    rng = np.random.default_rng(seed)
    A, B = random_array(rng, (m, k), np.float32), random_array(rng, (n, k), np.float32)
    out = tc.define(TMM).tmm(A, B, options=_tiles(*tile)).numpy()
    np.testing.assert_allclose(out, A @ B.T, rtol=1e-4, atol=1e-4)

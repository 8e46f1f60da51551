"""The original language's constructs beyond the corpus rows: outputs the caller provides
(``outputs=``: NumPy in place, ``tf.Variable`` assigned, tensors as initial values with their
gradient), typed outputs, guarded reads, ranges not starting at 0, and the located errors."""
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tfx_vec import tc_ops as tc

from .corpus import BY_NAME

BACKENDS = ["cpu", "opencl"]


def _entry(name, backend="cpu"):
    case = BY_NAME[name]
    return tc.define(case.source, backend=backend)[case.entry], case


@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions_without_init_reduce_into_the_given_numpy_outputs_in_place(backend):
    rng = np.random.default_rng(0)
    entry, case = _entry("rowmax_into", backend)
    X = random_array(rng, (5, 7))
    M = rng.standard_normal(5).astype(np.float32) * 3       # some rows above, some below
    before = M.copy()
    res = entry(X, outputs=[M])
    np.testing.assert_allclose(M, np.maximum(before, X.max(1)))
    np.testing.assert_allclose(res.numpy(), M)
    entry, _ = _entry("matmul_into", backend)
    A, B = random_array(rng, (4, 6)), random_array(rng, (6, 3))
    C = random_array(rng, (4, 3))
    C0 = C.copy()
    entry(A, B, outputs=[C])
    np.testing.assert_allclose(C, C0 + A @ B, rtol=1e-5)


def test_outputs_as_a_variable_are_assigned_and_tensors_are_initial_values():
    rng = np.random.default_rng(1)
    entry, _ = _entry("add_into")
    X, Y, O0 = (random_array(rng, (3, 4)) for _ in range(3))
    v = tf.Variable(O0)
    entry(tf.constant(X), tf.constant(Y), outputs=[v])
    np.testing.assert_allclose(v.numpy(), O0 + X + Y, rtol=1e-6)
    res = tf.function(lambda x, y, o: entry(x, y, outputs=[o]))(X, Y, tf.constant(O0))
    np.testing.assert_allclose(res.numpy(), O0 + X + Y, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gradient_reaches_the_initial_outputs(backend):
    rng = np.random.default_rng(2)
    entry, _ = _entry("rowmax_into", backend)
    X = tf.constant(random_array(rng, (4, 6)))
    M0 = tf.constant(np.array([9.0, -9.0, 9.0, -9.0], np.float32))   # wins, loses, ...
    w = tf.constant(rng.standard_normal(4).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch([X, M0])
        loss = tf.reduce_sum(w * entry(X, outputs=[M0]))
    dX, dM0 = tape.gradient(loss, [X, M0])
    np.testing.assert_allclose(dM0.numpy(), w.numpy() * [1, 0, 1, 0])
    expect = np.zeros((4, 6), np.float32)
    for r in (1, 3):
        expect[r, np.argmax(X.numpy()[r])] = w.numpy()[r]
    np.testing.assert_allclose(dX.numpy(), expect)


def test_outputs_are_checked_against_what_the_tc_computes():
    entry, _ = _entry("add_into")
    X = np.ones((2, 3), np.float32)
    with pytest.raises(tc.TcShapeError, match=r"outputs= tensor for O has shape \(3, 2\)"):
        entry(X, X, outputs=[np.zeros((3, 2), np.float32)])
    with pytest.raises(tc.TcShapeError, match="1 output"):
        entry(X, X, outputs=[np.zeros((2, 3), np.float32)] * 2)
    with pytest.raises(tc.TcShapeError, match="writable and C-contiguous"):
        entry(X, X, outputs=[np.zeros((3, 2), np.float32).T])


def test_typed_outputs_keep_their_type_and_sizes():
    entry, case = _entry("quantize")
    X = np.array([[0.5, -1.2], [2.25, 3.0]], np.float32)
    Q, rowsum = entry(X, np.float32(2))
    assert Q.dtype == tf.int32
    np.testing.assert_array_equal(Q.numpy(), [[1, -2], [4, 6]])
    src = "def f(float(N) X, float(M) Y) -> (float(M) O) { O(i) = X(i) }"
    with pytest.raises(tc.TcShapeError, match=r"line 1, column 49: .*output O is declared "
                                              r"\(M\) = \(3,\) but its statements define \(4,\)"):
        tc.define(src).f(np.ones(4, np.float32), np.ones(3, np.float32))
    with pytest.raises(tc.TcTypeError, match=r"line 1, column 37: .*Q is declared int32 but "
                                             r"the right side has type float"):
        tc.define("def g(float(N) X) -> (int32(N) Q) { Q(i) = X(i) * 2 }")
    with pytest.raises(tc.TcNameError, match="declared with size 'K', which no input declares"):
        tc.define("def h(float(N) X) -> (float(K) Q) { Q(i) = X(i) }")


def test_ranges_not_starting_at_zero_size_outputs_by_their_extent():
    entry = tc.define("def shift(float(N) X) -> (O) { O(i) = X(i - 2) }").shift
    assert entry.output_shapes((7,)) == ((7,),)
    entry = tc.define("def crop(float(N,M) X) -> (O) { O(i,j) = X(i,j) where i in 3:N-1 }").crop
    assert entry.output_shapes((9, 2)) == ((5, 2),)
    X = np.arange(18, dtype=np.float32).reshape(9, 2)
    np.testing.assert_array_equal(entry(X).numpy(), X[3:8])


def test_guarded_reads_are_checked_only_where_the_guard_holds():
    ok = tc.define("def d(float(N) X) -> (D) { D(i) = (i - 1 >= 0) ? X(i - 1) : 0 "
                   "where i in 0:N }").d
    np.testing.assert_array_equal(ok(np.arange(4, dtype=np.float32)).numpy(), [0, 0, 1, 2])
    with pytest.raises(tc.TcRangeError, match=r"line 1, column 37: .*subscript i - 1 of X "
                                              r"ranges over \[-1, 2\]"):
        tc.define("def u(float(N) X) -> (D) { D(i) = X(i - 1) where i in 0:N }").u(
            np.ones(4, np.float32))
    # the wrong guard does not protect the read
    with pytest.raises(tc.TcRangeError, match="subscript i - 1 of X"):
        tc.define("def w(float(N) X) -> (D) { D(i) = (i < N) ? X(i - 1) : 0 "
                  "where i in 0:N }").w(np.ones(4, np.float32))


@pytest.mark.parametrize("guard, safe", [
    ("i != N", True), ("!(i == N)", True), ("2 * i != 2 * N", True),
    ("!(i == 0 || i == N + 1)", True),
    ("i != 2", False),          # excludes an inner point only: i = N still reads X(N)
    ("i != N - 1", False),
])
def test_a_disequality_guard_protects_only_the_end_it_excludes(guard, safe):
    # Regression: a failed == guard (i != c) was taken as i <= c, accepting reads past the end.
    hi = "N+2" if "N + 1" in guard else "N+1"
    read = "X(i - 1)" if "N + 1" in guard else "X(i)"
    entry = tc.define(f"def g(float(N) X) -> (D) {{ D(i) = ({guard}) ? {read} : 0 "
                      f"where i in 0:{hi} }}").g
    X = np.arange(1, 6, dtype=np.float32)
    if not safe:
        with pytest.raises(tc.TcRangeError, match="dimension 0 of X has size 5"):
            entry(X)
        return
    want = np.concatenate([[0], X, [0]]) if "N + 1" in guard else np.append(X, 0)
    np.testing.assert_array_equal(entry(X).numpy(), want)


def test_bindings_exists_and_zero_d_reads_need_what_they_name():
    with pytest.raises(tc.TcNameError, match="where-clause constrains 'foo', which the "
                                             "statement does not use"):
        tc.define("def f(float(1) a) -> (b) { b(i) = 2*foo where foo = a(i), foo in 1:2 }")
    with pytest.raises(tc.TcSyntaxError, match="'foo' is bound twice"):
        tc.define("def f(float(1) a) -> (b) { b(i) = foo where foo = a(i), foo = a(i) }")
    with pytest.raises(tc.TcTypeError, match="tensor 'X' used without subscripts"):
        tc.define("def f(float(N) X) -> (b) { b(i) = X where i in 0:2 }")
    f = tc.define("def f(float(N) X) -> (s, b) { s +=! X(i)  b(i) = s where exists X(i) }").f
    s, b = f(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(b.numpy(), [6, 6, 6, 6])


def test_random_options_keep_the_constructs_equal():
    """Each construct under a few mapping options (tiles, fusion, no parallel/vectorize)."""
    rng = np.random.default_rng(3)
    opts = [tc.MappingOptions.naive(), tc.MappingOptions(tile=(2, 3), fusion_strategy="min"),
            tc.MappingOptions(tile=(5,), fusion_strategy="preserve3coincident", vectorize=False)]
    for name in ("rowmax_into", "quantize", "center", "exists_fill", "sqdiff", "causal_conv",
                 "prefix_sum", "backward_diff", "shift_crop"):
        entry, case = _entry(name)
        args = case.inputs(rng)
        for o in opts:
            for out, ref in zip(entry.run_numpy(*args, options=o), case.reference(*args)):
                np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=name)


def test_ranges_below_zero_and_the_old_range_syntax():
    """``O(i) = I(i + 5)`` ranges ``i`` over ``[-5, N-6]``: N elements (the original's
    PaddedConv/Shift1D2 inference); ``kh = [0, 2[`` is an older spelling of ``kh in 0:2``."""
    e = tc.define("def s(float(N) I) -> (O) { O(i) = I(i + 5) }").s
    X = np.arange(7, dtype=np.float32)
    np.testing.assert_array_equal(e(X).numpy(), X)
    pool = tc.define("def p(float(N) X) -> (Y) { Y(i) +=! X(2 * i + k) where k = [0, 2[ }").p
    np.testing.assert_array_equal(pool(X[:6]).numpy(), [1, 5, 9])


def test_equivalence_hints_variable_modulus_and_nextafter():
    f = tc.define("""def f(float(N) X, float(N) Y) -> (Z) {
        Z(i) = nextafter(X(i), Y(i)) <=> lib_nextafter(X(i), Y(i))
    }""").f
    X, Y = np.ones(3, np.float32), np.array([2, 0, 1], np.float32)
    np.testing.assert_array_equal(f(X, Y).numpy(), np.nextafter(X, Y))
    g = tc.define("def g(float(N) X) -> (Z) { Z(k) +=! X(k % c) where c in 1:4, k in 0:5 }").g
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(g(X).numpy(), [sum(X[k % c] for c in range(1, 4))
                                                 for k in range(5)])


def test_reads_guarded_by_data_dependent_conditions_are_checked_by_the_guard():
    """Segment code (the original's TUM example): ``NormData(Idx(k) + l)`` is only read where
    ``Idx(k) + l < Idx(k + 1)``, so the ids' values bound it, not the index ranges."""
    src = """def seg(float(N) X, int32(KP1) Idx) -> (S) {
        S(k, l) = (Idx(k) + l >= Idx(k + 1)) ? 0.0 : X(Idx(k) + l) where k in 0:KP1-1, l in 0:4
    }"""
    e = tc.define(src).seg
    X = np.arange(1, 8, dtype=np.float32)
    Idx = np.array([0, 3, 4, 7], np.int32)
    want = [[X[Idx[k] + l] if Idx[k] + l < Idx[k + 1] else 0 for l in range(4)] for k in range(3)]
    np.testing.assert_array_equal(e(X, Idx).numpy(), want)
    unguarded = src.replace("(Idx(k) + l >= Idx(k + 1)) ? 0.0 : ", "")
    with pytest.raises(tc.TcRangeError, match="subscript Idx\\(k\\) \\+ l of X"):
        tc.define(unguarded).seg(X, Idx)

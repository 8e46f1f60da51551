"""The issue's and the README's examples, verbatim, against NumPy."""
import numpy as np
import tensorflow as tf

from tests.support import random_array
from tfx_vec import tc_ops as tc


def test_issue_api_example():
    mod = tc.define("""
def tmm(float(M,K) A, float(N,K) B) -> (C) {
    C(m,n) +=! A(m,kk) * B(n,kk)
}
def fcrelu(float(B,M) I, float(N,M) W, float(N) bias) -> (O) {
    O(b,n) = bias(n)
    O(b,n) += I(b,m) * W(n,m)
    O(b,n) = fmaxf(O(b,n), 0)
}
""", backend="cpu")
    rng = np.random.default_rng(7)
    A, B = random_array(rng, (33, 17)), random_array(rng, (9, 17))
    C = mod.tmm(tf.constant(A), tf.constant(B))       # tf.Tensor in, tf.Tensor out
    assert isinstance(C, tf.Tensor)
    np.testing.assert_allclose(C.numpy(), A @ B.T, rtol=1e-5, atol=1e-5)
    C2 = mod.tmm(A, B)                                 # NumPy arrays accepted too
    np.testing.assert_allclose(C2.numpy(), C.numpy())
    assert "void tc_tmm(void* const* args)" in mod.tmm.source()
    W, bias = random_array(rng, (9, 17)), random_array(rng, (9,))
    O = mod.fcrelu(A, W, bias)
    np.testing.assert_allclose(O.numpy(), np.maximum(A @ W.T + bias, 0), rtol=1e-5, atol=1e-5)


def test_maxpool_and_gather_example():
    mod = tc.define("""
def maxpool2x2(float(B,C,H,W) in) -> (out) {
    out(b,c,i,j) max=! in(b,c, 2 * i + kw, 2 * j + kh) where kw in 0:2, kh in 0:2
}
def gather(float(N) X, int32(A,B) I) -> (Z) {
    Z(i,j) = X(I(i,j))
}
""")
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = mod.maxpool2x2(x)
    assert y.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(y.numpy(), x.reshape(2, 3, 4, 2, 4, 2).max(axis=(3, 5)))
    X = np.arange(1, 6, dtype=np.float32)
    idx = np.array([[4, 0], [1, 1]], np.int32)
    np.testing.assert_allclose(mod.gather(X, idx).numpy(), X[idx])
    try:
        mod.gather(X, np.array([[5]], np.int32))
    except tc.TcRangeError as e:
        assert "dimension 0 of X has size 5" in str(e)
    else:
        raise AssertionError("out-of-range index not caught")


def test_kernel_runs_inside_threads_concurrently():
    """Entries are thread-safe: concurrent first calls compile once and all agree."""
    import concurrent.futures as cf
    mod = tc.define("def sq(float(N) A) -> (B) { B(i) = A(i) * A(i) }")
    a = np.arange(1, 41, dtype=np.float32)
    with cf.ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: mod.sq(a).numpy(), range(8)))
    for o in outs:
        np.testing.assert_allclose(o, a * a)
    assert len(mod.sq._compiled) == 1


def test_entry_inside_tf_function_uses_the_tf_op():
    mod = tc.define("def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }")
    rng = np.random.default_rng(1)
    A, B = random_array(rng, (6, 5)), random_array(rng, (7, 5))
    f = tf.function(lambda a, b: mod.tmm(a, b) * 2)
    np.testing.assert_allclose(f(tf.constant(A), tf.constant(B)).numpy(), 2 * A @ B.T,
                               rtol=1e-5, atol=1e-5)
    graph = f.get_concrete_function(tf.TensorSpec((6, 5), tf.float32),
                                    tf.TensorSpec((7, 5), tf.float32)).graph
    assert "TcKernel" in {op.type for op in graph.get_operations()}

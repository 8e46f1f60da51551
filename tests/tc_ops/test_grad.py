"""Gradients of TC ops: derived backward TCs vs TF's gradients of equivalent ops and vs finite
differences; user-given backward TCs; the errors of what cannot be derived."""
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tests.tc_ops.corpus import BY_NAME
from tfx_vec.tc_ops.grad import TcGradientError, backward_tc
from tfx_vec.tc_ops.tf_op import tc_function


def _grads(fn, args, weights=None):
    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        outs = fn(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        w = weights or [1.0] * len(outs)
        # a loss that touches every output element with a different weight
        loss = sum(wk * tf.reduce_sum(o * _weights_like(o))
                   for wk, o in zip(w, outs) if o.dtype.is_floating)
    return [o.numpy() for o in outs], tape.gradient(loss, args)


def _weights_like(o):
    w = tf.cast(tf.range(tf.size(o)) % 7 + 1, o.dtype) / 7.0
    return tf.reshape(w, tf.shape(o))


def _compare(case_name, tf_fn, wrt=None, weights=None, rtol=1e-4, atol=1e-4):
    case = BY_NAME[case_name]
    args = case.inputs(np.random.default_rng(3))
    f = tc_function(case.source, case.entry, wrt=wrt)
    outs, g = _grads(f, args, weights)
    outs_tf, g_tf = _grads(tf_fn, args, weights)
    for a, b in zip(outs, outs_tf):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    names = [p.name for p in f.cdef.inputs]
    for name, a, b in zip(names, g, g_tf):
        if name in f.wrt:
            np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                                       tf.convert_to_tensor(b).numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"{case_name}: d/d{name}")
        else:
            assert a is None


def test_tmm_against_tf_matmul():
    _compare("tmm", lambda A, B: tf.matmul(A, B, transpose_b=True))


def test_fcrelu_against_tf():
    _compare("fcrelu", lambda I, W, b: tf.nn.relu(tf.matmul(I, W, transpose_b=True) + b))


def test_mlp3_against_tf():
    def mlp3(I, W2, B2, W3, B3, W4, B4):
        o2 = tf.nn.relu(tf.matmul(I, W2, transpose_b=True) + B2)
        o3 = tf.nn.relu(tf.matmul(o2, W3, transpose_b=True) + B3)
        return o2, o3, tf.nn.relu(tf.matmul(o3, W4, transpose_b=True) + B4)
    _compare("MLP3", mlp3)


def test_softmax_max_reduction_and_division_against_tf():
    def softmax(I):
        return (tf.nn.softmax(I, axis=1), tf.reduce_max(I, axis=1),
                tf.reduce_sum(tf.exp(I - tf.reduce_max(I, axis=1, keepdims=True)), axis=1))
    _compare("softmax", softmax, weights=[1.0, 0.5, 0.25])


def test_conv2d_weight_gradient_against_tf():
    def conv(I, W):  # NCHW / OIHW cross-correlation, valid padding
        out = tf.nn.conv2d(tf.transpose(I, [0, 2, 3, 1]), tf.transpose(W, [2, 3, 1, 0]), 1,
                           "VALID")
        return tf.transpose(out, [0, 3, 1, 2])
    _compare("conv2d", conv)  # the input's I(h + kh) goes through the one-hot path


def test_embedding_bag_lut_gradient_against_tf():
    def lut(LUT1, I1):
        return tf.reduce_sum(tf.gather(LUT1, I1), axis=1)
    _compare("1LUT", lut)


def test_finite_differences_on_a_nonlinear_double_tc():
    src = """def f(double(N,M) A, double(M) x) -> (y, z) {
        y(n) +=! tanh(A(n,m) * x(m)) / (1 + x(m) * x(m))
        z(n) = exp(y(n)) - sqrt(A(n,0) * A(n,0) + 1)
    }"""
    rng = np.random.default_rng(0)
    A, x = random_array(rng, (4, 5), np.float64), random_array(rng, (5,), np.float64)
    f = tc_function(src, "f")
    theoretical, numerical = tf.test.compute_gradient(lambda a, b: f(a, b)[1], [A, x], delta=1e-5)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-7)


def test_user_given_backward_tc():
    fwd = "def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }"
    bwd = "def sq_grad(float(N) X, float(N) dY) -> (dX) { dX(i) = 2 * X(i) * dY(i) }"
    f = tc_function(fwd, "sq", backward=(bwd, "sq_grad"))
    x = random_array(np.random.default_rng(1), (6,))
    _, (g,) = _grads(f, [x])
    _, (g_tf,) = _grads(lambda X: X * X, [x])
    np.testing.assert_allclose(g.numpy(), g_tf.numpy(), rtol=1e-6)


def test_gradient_inside_tf_function():
    case = BY_NAME["tmm"]
    A, B = case.inputs(np.random.default_rng(0))
    f = tc_function(case.source, case.entry)

    @tf.function
    def step(A, B):
        with tf.GradientTape() as tape:
            tape.watch(A)
            loss = tf.reduce_sum(f(A, B) ** 2)
        return tape.gradient(loss, A)

    C = A @ B.T
    np.testing.assert_allclose(step(A, B).numpy(), 2 * C @ B, rtol=1e-4, atol=1e-4)


def test_what_cannot_be_derived_is_a_located_error():
    with pytest.raises(TcGradientError, match=r"line 1, column \d+.*no derivative rule for "
                                              r"builtin erf"):
        backward_tc("def e(float(N) A) -> (B) { B(i) = erf(A(i)) }", "e")
    with pytest.raises(TcGradientError, match=r"\*= reductions"):
        backward_tc("def p(float(N,M) A) -> (P) { P(n) *=! A(n,m) }", "p")
    with pytest.raises(TcGradientError, match="not a floating-point tensor input"):
        backward_tc(BY_NAME["gather"].source, "gather", wrt=["I"])
    with pytest.raises(ValueError, match="wrt='I'"):
        tc_function(BY_NAME["gather"].source, "gather", wrt=["I"])

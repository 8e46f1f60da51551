"""TF1 graphs with TF1 control flow: gradients in the loop body through while loops (and
TensorArrays) built outside it, and TF1 while loops the body builds next to them; every
result is checked against the body run once per iteration in the same graph."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec


pytestmark = pytest.mark.usefixtures("tf1_control_flow")


def _against_each_iteration(loop_fn, n, **kw):
    """(pfor's result, the body's results stacked over ``range(n)``), both run in a session."""
    out = tfx_vec.pfor(loop_fn, n, **kw)
    expected = [loop_fn(tf.constant(k)) for k in range(n)]
    expected = tf.nest.map_structure(lambda *xs: tf.stack(xs), *expected)
    with tf.compat.v1.Session() as sess:
        return sess.run([out, expected])


def _assert_close(got, want):
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


def test_gradient_through_an_outer_while_loop_per_iteration(rng):
    xv = rng.normal(size=(2, 3)).astype(np.float32)
    yv = rng.normal(size=(3, 3)).astype(np.float32) / 2
    with tf.Graph().as_default():
        x, y = tf.constant(xv), tf.constant(yv)
        # Nonlinear steps: the gradient loop pops each step's value from an accumulator.
        _, out = tf.compat.v1.while_loop(lambda k, _: k < 3,
                                         lambda k, v: (k + 1, tf.tanh(tf.matmul(v, y))), [0, x])
        v = tf.constant(rng.normal(size=(4, 2)).astype(np.float32))

        def loop_fn(i):
            target = tf.reduce_sum(tf.gather(out, i % 3, axis=1) * tf.gather(v, i))
            return tf.gradients(target, [x, y])
        got, want = _against_each_iteration(loop_fn, 4, fallback_to_while_loop=False)
    _assert_close(got, want)


def test_gradient_through_an_outer_loop_writing_a_tensor_array(rng):
    xv = rng.normal(size=(2,)).astype(np.float32)
    with tf.Graph().as_default():
        x = tf.constant(xv)

        def step(k, ta):
            return k + 1, ta.write(k, x * tf.cast(k + 1, tf.float32) + tf.sin(x))
        _, ta = tf.compat.v1.while_loop(lambda k, _: k < 4, step,
                                        (0, tf.TensorArray(tf.float32, size=4)))
        out = ta.stack()
        got, want = _against_each_iteration(
            lambda i: tf.gradients(tf.gather(out, i) ** 2, x)[0], 4)
    _assert_close(got, want)


def test_own_while_loop_reading_an_outer_tensor_array_and_its_gradient(rng):
    inp_v = rng.normal(size=(3, 4, 2)).astype(np.float32)
    with tf.Graph().as_default():
        inp = tf.constant(inp_v)
        ta = tf.TensorArray(tf.float32, size=3, clear_after_read=False).unstack(inp)

        def loop_fn(i):
            def body(j, acc):
                row = tf.gather(tf.reshape(ta.gather([j]), [4, 2]), i)
                return j + 1, acc * 0.5 + row
            _, acc = tf.compat.v1.while_loop(lambda j, _: j < 3, body, (0, tf.ones([2])))
            total = tf.reduce_prod(acc)
            return total, tf.gradients(total, inp)[0]
        got, want = _against_each_iteration(loop_fn, 4)
    _assert_close(got, want)


def test_jacobian_of_a_scan(rng):
    with tf.Graph().as_default():
        x = tf.constant(rng.normal(size=(2, 3)).astype(np.float32))
        elems = tf.constant(rng.normal(size=(4,)).astype(np.float32))
        ys = tf.scan(lambda a, e: tf.sin(a) * e, elems, initializer=x)      # [4, 2, 3]
        jac = tfx_vec.jacobian(ys, x)
        flat = tf.reshape(ys, [-1])
        rows = [tf.gradients(flat[k], x)[0] for k in range(24)]
        want = tf.reshape(tf.stack(rows), [4, 2, 3, 2, 3])
        assert jac.shape.as_list() == [4, 2, 3, 2, 3]
        with tf.compat.v1.Session() as sess:
            got, want = sess.run([jac, want])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_tf1_conditional_next_to_such_a_gradient_is_an_error(rng):
    with tf.Graph().as_default():
        x = tf.constant(rng.normal(size=(3,)).astype(np.float32))
        _, out = tf.compat.v1.while_loop(lambda k, _: k < 2, lambda k, v: (k + 1, v * x),
                                         [0, x])

        def loop_fn(i):
            picked = tf.compat.v1.cond(i > 0, lambda: tf.gather(out, i), lambda: out[0])
            return tf.gradients(picked, x)[0]
        with pytest.raises(tfx_vec.VectorizationError, match="TF1 control-flow op"):
            tfx_vec.pfor(loop_fn, 3)
